"""The configuration store and its changes: validation names the field, writes are whole, corruption is caught."""

from __future__ import annotations

import sqlite3
import stat

import pytest

from pairmq.appliance.broker.access import hash_password
from pairmq.configsync.changes import GENESIS, apply_change, chain, describe, parse_change
from pairmq.configsync.document import ConfigChangeError, ConfigDocument
from pairmq.configsync.store import ConfigStore, ConfigStoreCorrupt, Entry

RECORD = hash_password(b"secret", b"s" * 16, n=2, r=1, p=1).to_document()
ADD_ANN = {"kind": "user.set", "username": "ann", "record": RECORD}
RULE = {"effect": "allow", "action": "publish", "filter": "cars/#", "who": "user:ann"}


@pytest.fixture
def store(tmp_path):
    s = ConfigStore(tmp_path / "config" / "config.db")
    yield s
    s.close()


def test_a_new_store_is_version_0_with_the_empty_document(store):
    assert (store.head.version, store.head.chain) == (0, GENESIS)
    assert store.head.digest == ConfigDocument().digest()
    assert store.changes_after(0) == []


def test_changes_apply_in_order_and_survive_a_reopen(tmp_path):
    path = tmp_path / "c.db"
    s = ConfigStore(path)
    s.apply(ADD_ANN, 1)
    s.apply({"kind": "acl.add", "rule": RULE}, 2)
    s.apply({"kind": "limits.set", "name": "session_queue_max_messages", "value": 500}, 3)
    s.apply({"kind": "overload.set", "name": "max_window", "value": 50}, 4)
    s.apply({"kind": "auto_revert.set", "enabled": True}, 5)
    head = s.head
    s.close()
    again = ConfigStore(path)
    assert again.head == head and head.version == 5
    doc = again.document
    assert set(doc.access.users) == {"ann"} and doc.access.rules[0].filter == "cars/#"
    assert doc.limits == {"session_queue_max_messages": 500} and doc.overload == {"max_window": 50}
    assert doc.auto_revert is True
    assert [e.version for e in again.changes_after(2)] == [3, 4, 5]
    assert again.chain_at(0) == GENESIS and again.chain_at(5) == head.chain
    again.close()


@pytest.mark.parametrize("change, field", [
    ({"kind": "user.set", "username": "", "record": RECORD}, "change.username"),
    ({"kind": "user.set", "username": "bob", "record": {**RECORD, "n": 3}}, "change.record.n"),
    ({"kind": "user.delete", "username": "nobody"}, "change.username"),
    ({"kind": "acl.add", "rule": {**RULE, "filter": "a/#/b"}}, "change.rule.filter"),
    ({"kind": "acl.add", "rule": {**RULE, "effect": "maybe"}}, "change.rule.effect"),
    ({"kind": "acl.delete", "index": 3}, "acl"),
    ({"kind": "acl.delete", "index": -1}, "change.index"),
    ({"kind": "limits.set", "name": "session_queue_max_messages", "value": 0}, "session_queue_max_messages"),
    ({"kind": "limits.set", "name": "colour", "value": 3}, "unknown limit 'colour'"),
    ({"kind": "overload.set", "name": "min_window", "value": 500}, "min_window"),
    ({"kind": "overload.set", "name": "max_window", "value": "many"}, "overload.max_window"),
    ({"kind": "auto_revert.set", "enabled": "yes"}, "change.enabled"),
    ({"kind": "anonymous.set"}, "needs 'allowed'"),
    ({"kind": "anonymous.set", "allowed": True, "extra": 1}, "no field 'extra'"),
    ({"kind": "drop.tables"}, "change.kind"),
    ({"kind": "document.replace", "document": {"version": 1, "limits": []}}, "change.document.limits"),
    ("user.set", "JSON object"),
])
def test_a_bad_change_is_refused_naming_its_field_and_nothing_changes(store, change, field):
    before = store.head
    with pytest.raises(ConfigChangeError) as info:
        store.apply(change, 1)
    assert field in str(info.value)
    assert store.head == before and store.changes_after(0) == []


def test_a_deleted_user_is_gone_and_the_digest_moves(store):
    store.apply(ADD_ANN, 1)
    with_ann = store.head.digest
    store.apply({"kind": "user.delete", "username": "ann"}, 2)
    assert "ann" not in store.document.access.users
    assert store.head.digest != with_ann
    assert store.head.digest == ConfigDocument().digest()  # the same content has the same digest


def test_the_chain_commits_to_every_change_in_order():
    a, b = {"kind": "anonymous.set", "allowed": True}, {"kind": "anonymous.set", "allowed": False}
    assert chain(chain(GENESIS, a), b) != chain(chain(GENESIS, b), a)


def test_mate_entries_apply_whole_or_not_at_all(tmp_path):
    active, standby = ConfigStore(tmp_path / "a.db"), ConfigStore(tmp_path / "b.db")
    e1 = active.apply(ADD_ANN, 1)
    e2 = active.apply({"kind": "acl.add", "rule": RULE}, 2)
    forged = Entry(3, {"kind": "anonymous.set", "allowed": True}, "ab" * 32, 3)
    with pytest.raises(ConfigChangeError, match="chain"):
        standby.apply_entries([e1, e2, forged])
    assert standby.head.version == 0
    gap = Entry(2, e2.change, e2.chain)
    with pytest.raises(ConfigChangeError, match="expected version 1"):
        standby.apply_entries([gap])
    standby.apply_entries([e1, e2])
    assert standby.head == active.head
    active.close(), standby.close()


def test_the_history_is_bounded_and_a_node_behind_it_needs_a_snapshot(tmp_path):
    s = ConfigStore(tmp_path / "c.db", max_history=3)
    for i in range(6):
        s.apply({"kind": "overload.set", "name": "max_window", "value": 10 + i}, i)
    assert [e.version for e in s.changes_after(3)] == [4, 5, 6]
    assert s.changes_after(2) is None and s.chain_at(0) is None
    s.close()
    assert ConfigStore(tmp_path / "c.db", max_history=3).head.version == 6  # a trimmed history still checks


def test_a_snapshot_replaces_everything(tmp_path):
    a, b = ConfigStore(tmp_path / "a.db"), ConfigStore(tmp_path / "b.db")
    a.apply(ADD_ANN, 1)
    b.apply({"kind": "anonymous.set", "allowed": True}, 1)
    b.install(a.head.version, a.head.chain, a.document)
    assert b.head == a.head and b.changes_after(0) is None  # its history starts at the snapshot
    b.close()
    reopened = ConfigStore(tmp_path / "b.db")
    assert reopened.head == a.head and set(reopened.document.access.users) == {"ann"}


def test_an_altered_document_is_caught_at_open(tmp_path):
    path = tmp_path / "c.db"
    s = ConfigStore(path)
    s.apply(ADD_ANN, 1)
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE head SET document = replace(document, '\"ann\"', '\"eve\"')")
    conn.commit(), conn.close()
    with pytest.raises(ConfigStoreCorrupt, match="digest does not match.*move it aside"):
        ConfigStore(path)


def test_a_broken_history_is_caught_at_open(tmp_path):
    path = tmp_path / "c.db"
    s = ConfigStore(path)
    s.apply(ADD_ANN, 1)
    s.apply({"kind": "anonymous.set", "allowed": True}, 2)
    s.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE changes SET change = '{\"kind\":\"anonymous.set\",\"allowed\":false}' WHERE version = 2")
    conn.commit(), conn.close()
    with pytest.raises(ConfigStoreCorrupt, match="change 2 does not chain"):
        ConfigStore(path)


def test_a_file_that_is_not_a_database_is_refused_clearly(tmp_path):
    path = tmp_path / "c.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigStoreCorrupt, match="cannot be read"):
        ConfigStore(path)


def test_describe_never_shows_a_hash():
    line = describe(ADD_ANN)
    assert "ann" in line and RECORD["hash"] not in line
    assert describe({"kind": "limits.set", "name": "spool_max_bytes", "value": None}) == \
        "limits.spool_max_bytes set to the default"


def test_parse_change_checks_fields_without_a_document():
    assert parse_change({"kind": "user.delete", "username": "ann"})["username"] == "ann"  # fits no doc yet: fine
    with pytest.raises(ConfigChangeError):
        apply_change(ConfigDocument(), {"kind": "user.delete", "username": "ann"})


def test_an_in_memory_store_touches_no_file_and_no_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tmp_path.chmod(0o755)
    ConfigStore(":memory:").close()
    assert list(tmp_path.iterdir()) == [] and stat.S_IMODE(tmp_path.stat().st_mode) == 0o755
