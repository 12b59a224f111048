"""The listener's two hooks for this issue, without a group: the CONNECT check (`authenticate`) and TLS.

Real sockets on 127.0.0.1 with port 0 (no fixed ports, no lock). The
authenticator is the real one (appliance/broker/authn.py) over a real policy;
the event loop is uvloop, as in the node, and plain asyncio.
"""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest
import uvloop

from pairmq.appliance.broker.access import AccessPolicy, hash_password
from pairmq.appliance.broker.authn import Authenticator
from pairmq.appliance.config import TlsConfig
from pairmq.appliance.mqtt.listener import MqttListener
from pairmq.appliance.tls import server_context
from tests.harness.certs import make_pki
from tests.unit.test_mqtt_listener import Events, FlipGate

HOST = "127.0.0.1"
CONNECT_311 = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x1e\x00\x04abcd"


def connect_packet(user: str, password: str, version: int = 4) -> bytes:
    props = b"\x00" if version == 5 else b""
    body = (b"\x00\x04MQTT" + bytes([version, 0xC2]) + b"\x00\x1e" + props + b"\x00\x02id"
            + len(user).to_bytes(2, "big") + user.encode() + len(password).to_bytes(2, "big") + password.encode())
    return bytes([0x10, len(body)]) + body


@pytest.fixture(params=["uvloop", "asyncio"])
def run(request):
    return uvloop.run if request.param == "uvloop" else asyncio.run


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), addresses=(HOST,))


async def exchange(port: int, data: bytes, context: ssl.SSLContext | None = None) -> bytes:
    reader, writer = await asyncio.open_connection(HOST, port, ssl=context, server_hostname=HOST if context else None)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(64), 5)
    finally:
        writer.close()


def test_authenticate_refuses_with_its_code_and_the_gate_is_asked_again(run):
    policy = AccessPolicy(False, {"alice": hash_password(b"pw", b"0123456789abcdef", n=16, r=1, p=1)})

    async def scenario():
        gate, authn = FlipGate(), Authenticator(policy)

        async def check(c, peer):
            answer = await authn.check(c)
            if c.client_id == "id" and c.username == "late":
                gate.serving = False  # the lease ends while the password is being checked
            return answer

        listener = MqttListener(HOST, 0, gate, credential_check=check)
        await listener.start()
        try:
            assert await exchange(listener.port, connect_packet("alice", "bad")) == b"\x20\x02\x00\x04"
            v5 = await exchange(listener.port, connect_packet("alice", "bad", 5))
            assert v5[0] == 0x20 and v5[3] == 0x86 and b"bad user name or password" in v5
            assert await exchange(listener.port, CONNECT_311) == b"\x20\x02\x00\x05"
            assert await exchange(listener.port, connect_packet("alice", "pw")) == b"\x20\x02\x00\x00"
            policy2 = AccessPolicy(True, {"late": policy.users["alice"]})
            authn.policy = policy2
            assert await exchange(listener.port, connect_packet("late", "pw")) == b"\x20\x02\x00\x03"
        finally:
            await listener.stop()
            authn.close()

    run(scenario())


def test_tls_serves_and_counts_failed_handshakes(run, pki):
    async def scenario():
        events = Events()
        listener = MqttListener(HOST, 0, FlipGate(), on_event=events,
                                ssl=server_context(TlsConfig(pki.cert_file, pki.key_file)))
        await listener.start()
        client = ssl.create_default_context(cafile=str(pki.ca_file))
        try:
            for _ in range(20):  # more than once: a handshake must never lose the race with the first read
                assert await exchange(listener.port, CONNECT_311, client) == b"\x20\x02\x00\x00"
            assert await exchange(listener.port, CONNECT_311) == b""  # plain MQTT: closed, no CONNACK
            assert listener.tls_handshake_failures == 1
            assert events.expect("tls_handshake_failed")["reason"]
        finally:
            await listener.stop()

    run(scenario())
