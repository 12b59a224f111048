"""Hostile networks on 8301/8302: forward secrecy, men in the middle and replayed handshakes.

The mate link and config-sync share one handshake (mate_link/secure.py). Both ends run in this
process as the nodes run them (MateConnection over real loopback sockets); a relay between them
records, rewrites or replays the bytes, as an attacker on the wire would.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import struct

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from pairmq.appliance.roles import Role
from pairmq.mate_link.messages import Ping, Snapshot
from pairmq.mate_link.secure import ActiveHandshake, StandbyHandshake
from tests.unit.test_mate_link_transport import End, port_of

SECRET, GROUP = b"g" * 32, "plant-7"
PAYLOAD = b"the patient's blood pressure is 120/80"
_LEN = struct.Struct(">I")


def in_a_loop(test):
    """Run the coroutine test (with its parameters) in a fresh event loop, bounded in time."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 20))
    return run


def ends(purpose: str, standby_secret: bytes = SECRET) -> tuple[End, End]:
    return (End(ActiveHandshake(SECRET, GROUP, Role.PRIMARY, os.urandom(32), purpose)),
            End(StandbyHandshake(standby_secret, GROUP, Role.BACKUP, os.urandom(32), purpose)))


async def relayed(active: End, standby: End, *, to_active=None, to_standby=None):
    """Serve `active`, dial it from `standby` through a relay; returns the bytes each way as recorded.

    `to_active` / `to_standby` rewrite each chunk on its way (an active attacker), None passes it on.
    """
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: active.conn, "127.0.0.1", 0)
    recorded = {"to_active": bytearray(), "to_standby": bytearray()}

    async def pipe(reader, writer, name, rewrite):
        while data := await reader.read(65536):
            recorded[name] += data
            writer.write(rewrite(data) if rewrite else data)
        writer.close()

    async def on_client(c_reader, c_writer):
        s_reader, s_writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        await asyncio.gather(pipe(c_reader, s_writer, "to_active", to_active),
                             pipe(s_reader, c_writer, "to_standby", to_standby), return_exceptions=True)

    proxy = await asyncio.start_server(on_client, "127.0.0.1", 0)
    await loop.create_connection(lambda: standby.conn, "127.0.0.1", port_of(proxy))
    return recorded, (server, proxy)


def messages(stream: bytes) -> list[bytes]:
    out = []
    while len(stream) >= _LEN.size:
        (length,) = _LEN.unpack_from(stream)
        out.append(bytes(stream[:_LEN.size + length]))
        stream = stream[_LEN.size + length:]
    return out


def _hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(ikm)


def attacker_keys(secret: bytes, hello: bytes, challenge: bytes, purpose: str) -> list[bytes]:
    """Every frame key someone holding the group secret and the recorded handshake can compute.

    The pre-shared-key design (v2) made them from the secret and the two nonces alone; for the
    new one the attacker also tries everything public (nonces, public keys, transcript hash).
    """
    body_h, body_c = hello[_LEN.size:], challenge[_LEN.size:]
    version, glen = body_h[4], body_h[5]
    nonce_s = body_h[6 + glen + 2:6 + glen + 2 + 32]
    nonce_a = body_c[1:33]
    public = body_h[6 + glen + 2 + 32:] + body_c[33:-32]  # empty for v2: it has no public keys
    transcript_hash = hashlib.sha256(body_h + body_c).digest()
    keys = []
    for v in {version, 2, 3}:
        auth = _hkdf(secret, b"pairmq-group-secret", b"pairmq/%s/v%d/auth/%s" % (purpose.encode(), v, GROUP.encode()))
        for label in {b"mate-link", purpose.encode()}:
            for direction in (b"to-active", b"to-standby"):
                info = b"pairmq/%s/v%d/frames/%s" % (label, v, direction)
                keys.append(_hkdf(auth, nonce_s + nonce_a, info))
                for ikm in (auth, public + auth, auth + public):
                    keys.append(_hkdf(ikm, transcript_hash, info))
    return keys


def opened_by(keys: list[bytes], frame: bytes) -> bytes | None:
    header, sealed = frame[:_LEN.size], frame[_LEN.size:]
    for key in keys:
        try:
            return AESGCM(key).decrypt(b"\x00" * 12, sealed, header)  # the first frame has counter 0
        except InvalidTag:
            continue
    return None


@pytest.mark.parametrize("purpose", ["mate-link", "config-sync"])
@in_a_loop
async def test_a_recorded_session_stays_private_from_whoever_learns_the_secret_later(purpose):
    active, standby = ends(purpose)
    recorded, servers = await relayed(active, standby)
    await asyncio.wait_for(asyncio.gather(active.established.wait(), standby.established.wait()), 5)
    active.conn.send([Snapshot(4, (PAYLOAD,))])
    assert await asyncio.wait_for(standby.received.get(), 5) == Snapshot(4, (PAYLOAD,))
    standby.conn.close("recorded")
    await asyncio.wait_for(active.ended, 5)
    for s in servers:
        s.close()

    hello, proof_and_after = messages(recorded["to_active"])[0], messages(recorded["to_active"])[1:]
    challenge, frame = messages(recorded["to_standby"])
    assert PAYLOAD not in recorded["to_standby"]  # sealed on the wire, as before
    keys = attacker_keys(SECRET, hello, challenge, purpose)
    assert opened_by(keys, frame) is None, "the group secret and the recording open the session"
    assert proof_and_after  # the standby's proof was recorded too, and gives the attacker nothing more


def _swap_public_key(offset_from_end: int):
    """Rewrite the first handshake message's ephemeral key with the attacker's own (no secret held)."""
    done = []

    def rewrite(data: bytes) -> bytes:
        if done:
            return data
        done.append(True)
        start = len(data) - offset_from_end
        return data[:start] + os.urandom(32) + data[start + 32:]
    return rewrite


@in_a_loop
async def test_a_man_in_the_middle_without_the_secret_cannot_swap_either_ephemeral_key():
    # HELLO ends with epk_s; CHALLENGE ends with epk_a followed by the 32-byte proof. Either way the
    # active's proof covers a transcript the standby did not see, and the active proves first.
    for where, rewrite in (("to_active", _swap_public_key(32)), ("to_standby", _swap_public_key(64))):
        active, standby = ends("mate-link")
        _, servers = await relayed(active, standby, **{where: rewrite})
        assert "bad_proof" in await asyncio.wait_for(standby.ended, 5)
        await asyncio.wait_for(active.ended, 5)
        assert standby.counters["bad_proof"] == 1
        assert not active.established.is_set() and not standby.established.is_set()
        for s in servers:
            s.close()


@in_a_loop
async def test_a_replayed_handshake_is_refused_by_either_end():
    active, standby = ends("mate-link")
    recorded, servers = await relayed(active, standby)
    await asyncio.wait_for(asyncio.gather(active.established.wait(), standby.established.wait()), 5)
    standby.conn.send([Ping(4, 1)])
    await asyncio.wait_for(active.received.get(), 5)
    standby.conn.close("recorded")
    await asyncio.wait_for(active.ended, 5)

    # the standby's side of the session, replayed at a fresh active: its fresh nonce and key void the proof
    fresh_active, _ = ends("mate-link")
    server = await asyncio.get_running_loop().create_server(lambda: fresh_active.conn, "127.0.0.1", 0)
    _, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
    writer.write(bytes(recorded["to_active"]))
    assert "bad_proof" in await asyncio.wait_for(fresh_active.ended, 5)

    # the active's side, replayed at a fresh standby that dials the attacker
    _, fresh_standby = ends("mate-link")
    challenge = messages(recorded["to_standby"])[0]

    async def fake_active(reader, w):
        await reader.read(65536)
        w.write(challenge)
        await reader.read(65536)
    fake = await asyncio.start_server(fake_active, "127.0.0.1", 0)
    await asyncio.get_running_loop().create_connection(lambda: fresh_standby.conn, "127.0.0.1", port_of(fake))
    assert "bad_proof" in await asyncio.wait_for(fresh_standby.ended, 5)
    assert fresh_active.counters["bad_proof"] == fresh_standby.counters["bad_proof"] == 1
    writer.close()
    for s in (*servers, server, fake):
        s.close()
