"""A wrong-password flood from one address does not starve a legitimate first login (a real node).

The attacker's 300 sockets come from another loopback source address than the
legitimate client's and keep re-sending CONNECTs with wrong passwords for the
legitimate user's own name. The legitimate client's credentials were never
checked before (nothing cached: as after a failover). What is asserted is the
outcome, never a duration: it is accepted, and the attacker was throttled.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading

import pytest

from pairmq.appliance.broker.access import AccessPolicy, hash_password
from pairmq.appliance.roles import Role
from tests.harness.group import LOOPBACK, Group
from tests.harness.mqttraw import CONNACK, PORT, V5, Raw, encode_props, utf8

P = Role.PRIMARY
HOST = LOOPBACK[P]
ATTACKER = HOST.rsplit(".", 1)[0] + "." + str(int(HOST.rsplit(".", 1)[1]) + 7)
SOCKETS = 300
SERVER_BUSY = 0x89


def connect_body(client_id: str, user: str, password: bytes) -> bytes:
    body = utf8("MQTT") + bytes([V5, 0x02 | 0xC0]) + struct.pack("!H", 60) + encode_props([]) + utf8(client_id)
    return body + utf8(user) + struct.pack("!H", len(password)) + password


def framed(body: bytes) -> bytes:
    from tests.harness.mqttraw import vbi

    return b"\x10" + vbi(len(body)) + body


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    users = {"erin": hash_password(b"erin-password", os.urandom(16))}
    with Group(tmp_path_factory.mktemp("hostile-logins") / "group", access=AccessPolicy(False, users)) as g:
        g.start()
        g.wait_for("the primary to serve", lambda: g.serving(P), timeout_s=30)
        yield g


class Flood:
    """SOCKETS connections from ATTACKER, each CONNECTing with a wrong password again as soon as it is answered."""

    def __init__(self) -> None:
        self.codes: dict[int, int] = {}
        self.started = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> "Flood":
        self._thread.start()
        assert self.started.wait(30)
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join(60)

    async def _main(self) -> None:
        tasks = [asyncio.create_task(self._one(i)) for i in range(SOCKETS)]
        await asyncio.sleep(0.5)  # every socket has sent its first CONNECT
        self.started.set()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, i: int) -> None:
        packet = framed(connect_body(f"flood-{i}", "erin", b"wrong-password-%d" % i))
        while not self._stop:
            try:
                reader, writer = await asyncio.open_connection(HOST, PORT, local_addr=(ATTACKER, 0))
                writer.write(packet)
                head = await asyncio.wait_for(reader.readexactly(4), 30)
                if head[0] >> 4 == CONNACK:
                    self.codes[head[3]] = self.codes.get(head[3], 0) + 1
                writer.close()
                await asyncio.sleep(0.02)
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                await asyncio.sleep(0.05)


def test_a_legitimate_first_login_succeeds_during_a_wrong_password_flood(group):
    with Flood() as flood:
        raw = Raw(V5, HOST, PORT)
        raw.send(0x10, connect_body("erin-1", "erin", b"erin-password"))
        connack = raw.recv(timeout_s=60)
        assert connack is not None and connack.type == CONNACK
        assert connack.reason_and_props()[0] == 0, flood.codes
        raw.close()
    assert flood.codes.get(SERVER_BUSY, 0) > 0, flood.codes  # throttled at once, not queued behind scrypt
    access = group.api(P, "/api/v1/redundancy")["mqtt"]["access"]
    assert access["login_throttled"] > 0 and access["scrypt_runs"] < SOCKETS
