BEGIN TRANSACTION;
CREATE TABLE [changes] ([version] INTEGER PRIMARY KEY, [change] TEXT NOT NULL, [chain] TEXT NOT NULL, [at_ms] INTEGER NOT NULL);
INSERT INTO "changes" VALUES(1,'{"kind":"user.set","record":{"hash":"effdb9b16840f7a25de952074e7705111c9e7658beb1c41feced79a7e1f2d5fb","n":2,"p":1,"r":1,"salt":"73737373737373737373737373737373","scheme":"scrypt"},"username":"ann"}','c7e5b8a9339b6911eb3f26dc5d6e96352c5c0277d985e146711ecf685f4baf2c',1700000000001);
INSERT INTO "changes" VALUES(2,'{"kind":"acl.add","rule":{"action":"publish","effect":"allow","filter":"cars/#","who":"user:ann"}}','0fc12a14c1462d4a0b2516dcdd9d6c271da29546b26b4330a9eabb3fad1a5800',1700000000002);
INSERT INTO "changes" VALUES(3,'{"kind":"limits.set","name":"session_queue_max_messages","value":500}','5d95a52c3b610293a8fcf75f052ab4b1ffd274aa385014c9e051dc5071ecfeaa',1700000000003);
INSERT INTO "changes" VALUES(4,'{"allowed":false,"kind":"anonymous.set"}','e73207eabf4a11438642cc9cbb0523b6ec8872ae1d57ab69781dbf7adba62224',1700000000004);
CREATE TABLE [head] ([id] INTEGER PRIMARY KEY, [version] INTEGER NOT NULL, [chain] TEXT NOT NULL, [digest] TEXT NOT NULL, [document] TEXT NOT NULL);
INSERT INTO "head" VALUES(1,4,'e73207eabf4a11438642cc9cbb0523b6ec8872ae1d57ab69781dbf7adba62224','1e25cc86c8f1e0be7db42386cc4a9462672953757243eab176eabae6b194b125','{"access":{"acl":[{"action":"publish","effect":"allow","filter":"cars/#","who":"user:ann"}],"allow_anonymous":false,"users":{"ann":{"hash":"effdb9b16840f7a25de952074e7705111c9e7658beb1c41feced79a7e1f2d5fb","n":2,"p":1,"r":1,"salt":"73737373737373737373737373737373","scheme":"scrypt"}},"version":1},"auto_revert":null,"limits":{"session_queue_max_messages":500},"overload":{},"version":1}');
COMMIT;
