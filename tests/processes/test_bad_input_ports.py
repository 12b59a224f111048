"""Bad-input sweep (docs/reliability.md): garbage, truncated and oversized input on every TCP port of a live
group, and damaged stores at start-up.

Rules the sweep holds every node to:
- Each bad input gets a clear refusal: an HTTP 4xx with a JSON or plain error on 8080, a closed
  connection (and a counted, logged refusal) on the mate link 8301 and config-sync 8302, a closed
  connection (or the spec's DISCONNECT) on MQTT 1883. The server closes; it never waits forever.
- No node crashes or logs a traceback; the primary keeps serving in the same epoch; the backup
  stays in sync; no redundancy decision is taken because of the input.
- Nothing acknowledged is lost: QoS 1 messages acknowledged before the sweep reach their
  persistent subscriber afterwards.

Damaged stores at start-up are tests/processes/test_damaged_stores.py.
The heartbeat port 8300 (UDP) gets the same treatment in tests/processes/test_forged_heartbeats.py
(garbage, truncated and oversized datagrams up to 65507 bytes, counted as `malformed`).
"""

from __future__ import annotations

import json
import os
import random
import socket
import urllib.error
import urllib.request

import pytest

from pairmq.appliance.config import load_secret
from pairmq.appliance.keyring import management_token
from pairmq.appliance.roles import Role
from pairmq.mate_link.secure import MAGIC, StandbyHandshake
from tests.harness.group import Group, active_group
from tests.harness.paho_clients import client, resume_and_collect, subscribe_then_go_offline

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
CLOSE_WITHIN_S = 10  # the mate handshake times out well inside this; every other case closes at once
ACKED_BEFORE = 30
ROUTINE_DECISIONS = ("sync", "refuse")  # what a steady group logs anyway (see test_forged_heartbeats.py)
noise = random.Random(8).randbytes  # the same garbage on every run


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A steady group with QoS 1 messages acknowledged for an offline persistent subscriber."""
    with active_group(tmp_path_factory.mktemp("sweep") / "group") as g:
        host = g.address(P)
        subscribe_then_go_offline(host)
        pub, _ = client("sweep-publisher", host, persistent=False)
        infos = [pub.publish("cars/7/door", str(i).encode(), qos=1) for i in range(ACKED_BEFORE)]
        for info in infos:
            info.wait_for_publish(5)
            assert info.is_published()
        pub.disconnect()
        pub.loop_stop()
        g.acked = [str(i).encode() for i in range(ACKED_BEFORE)]
        g.epoch_before = view(g, P)["epoch"]
        g.decisions_before = {r: _decisions(g, r) for r in Role}
        yield g


def view(g: Group, role: Role) -> dict:
    return g.api(role, "/api/v1/redundancy")


def _decisions(g: Group, role: Role) -> list[str]:
    return [d["kind"] for d in g.decisions(role) if d["kind"] not in ROUTINE_DECISIONS]


def exchange(address: str, port: int, payload: bytes, *, end_input: bool = True) -> bytes:
    """Send `payload`, signal end of input (unless told not to), and read until the server closes;
    what it answered."""
    answer = bytearray()
    with socket.create_connection((address, port), timeout=CLOSE_WITHIN_S) as s:
        try:
            s.sendall(payload)
            if end_input:
                s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:  # closed with our bytes unread: a refusal too
            pass
        except socket.timeout:
            pytest.fail(f"{address}:{port} neither answered nor closed within {CLOSE_WITHIN_S} s "
                        f"after {payload[:40]!r}... ({len(payload)} bytes)")
    return bytes(answer)


def assert_unharmed(g: Group) -> None:
    for role, proc in g.procs.items():
        assert proc.poll() is None, f"the {role.value} node exited ({proc.returncode}):\n{g.logs_tail(20)}"
    for role in Role:
        log = (g.dir / f"{role.value}.log").read_text(errors="replace")
        assert "Traceback" not in log, f"the {role.value} node logged a traceback:\n{log[-3000:]}"
    primary, backup = view(g, P), view(g, B)
    assert primary["serving"] and primary["epoch"] == g.epoch_before, primary
    assert backup["in_sync"], backup
    for role in Role:
        assert _decisions(g, role) == g.decisions_before[role], f"{role.value} took a decision: {g.decisions(role)}"


def refusals(g: Group, role: Role, part: str) -> int:
    """How many connections `role` refused on the mate link or config-sync (its own counters)."""
    v = view(g, role)
    counters = v["mate_link_refusals"] if part == "mate_link" else config_sync_view(g, role)["refusals"]
    return sum(counters.values())


def config_sync_view(g: Group, role: Role) -> dict:
    return g.api(role, "/api/v1/config-sync")


# --- the mate link (8301) and config-sync (8302): garbage, truncated, oversized -----------------


def handshake_inputs(group_name: str) -> dict[str, bytes]:
    hello = StandbyHandshake(os.urandom(32), group_name, B, os.urandom(32)).data_to_send()
    return {
        "garbage": noise(4096),
        "http on the wrong port": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "truncated hello": hello[: len(hello) // 2],
        "hello with the wrong magic": hello[:4] + b"XXXX" + hello[8:],
        "oversized handshake message": (2**32 - 1).to_bytes(4, "big") + MAGIC + os.urandom(1024),
        "hello then noise (a wrong proof)": hello + os.urandom(36),
    }


@pytest.mark.parametrize("part", ["mate_link", "config_sync"])
@pytest.mark.parametrize("role", [P, B])
def test_bad_input_on_the_mate_ports_is_refused_and_counted(swept, part, role):
    port = getattr(swept.config.ports, part)
    before = refusals(swept, role, part)
    inputs = handshake_inputs(swept.config.name)
    for name, payload in inputs.items():
        answer = exchange(swept.address(role), port, payload)
        assert len(answer) <= 128, f"{part} answered {name!r} with {len(answer)} bytes: {answer[:64]!r}"
    swept.wait_for(f"the {role.value} to count {len(inputs)} refusals on {part}",
                   lambda: refusals(swept, role, part) - before >= len(inputs), timeout_s=CLOSE_WITHIN_S)
    log = (swept.dir / f"{role.value}.log").read_text(errors="replace")
    assert "refused (malformed)" in log, log[-2000:]
    assert_unharmed(swept)


# --- the management API (8080) -------------------------------------------------------------------


def http_raw(g: Group, role: Role, request: bytes) -> tuple[int, bytes]:
    answer = exchange(g.address(role), g.config.ports.management, request, end_input=False)
    status_line = answer.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1."), f"not an HTTP answer to {request[:40]!r}: {answer[:80]!r}"
    return int(status_line.split()[1]), answer


@pytest.mark.parametrize("role", list(Role))
def test_garbage_and_oversized_http_get_a_4xx(swept, role):
    cases = {
        "garbage": (noise(256).replace(b"\r", b"").replace(b"\n", b"") + b"\r\n\r\n", (400,)),
        "a request line that is not HTTP": (b"HELLO WORLD\r\n\r\n", (400,)),
        "an oversized header": (b"GET /api/v1/redundancy HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000
                                + b"\r\n\r\n", (400, 431)),
        "an oversized request line": (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", (400, 414)),
        # Every route needs a credential, unknown ones too (routes can't be probed): 401, not 404.
        "an unknown path": (b"GET /api/v1/no-such-thing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", (401,)),
    }
    for name, (request, statuses) in cases.items():
        status, answer = http_raw(swept, role, request)
        assert status in statuses, f"{name}: {answer[:200]!r}"
    # A truncated request (a body shorter than its Content-Length, then end of input) is closed, not awaited.
    exchange(swept.address(role), swept.config.ports.management,
             b"POST /api/v1/config/changes HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"chan")
    assert_unharmed(swept)


def authorized_post(g: Group, path: str, body: bytes) -> tuple[int, dict]:
    from pairmq.cli.api import signed_headers

    url = f"http://{g.address(P)}:{g.config.ports.management}{path}"
    request = urllib.request.Request(url, data=body, method="POST", headers={
        **signed_headers(management_token(load_secret(g.config)), "POST", url, body),
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


@pytest.mark.parametrize("body, status, words", [
    (b"{\"changes\": [", 400, "JSON"),
    (b"\xff\xfe not utf-8", 400, "JSON"),
    (b"[1, 2, 3]", 400, ""),
    (b"{\"changes\": [{\"kind\": \"user.set\"}]}", 400, "changes[0]"),
    (b"{\"changes\": [\"" + b"a" * (3 << 20) + b"\"]}", 413, ""),
])
def test_bad_change_bodies_get_a_json_error_and_change_nothing(swept, body, status, words):
    before = config_sync_view(swept, P)
    got, answer = authorized_post(swept, "/api/v1/config/changes", body)
    assert got == status and isinstance(answer.get("error"), str) and words in answer["error"], (got, answer)
    after = config_sync_view(swept, P)
    assert after["version"] == before["version"] and after["digest"] == before["digest"], (before, after)
    assert_unharmed(swept)


# --- MQTT (1883) -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name, payload", [
    ("garbage", noise(1024)),
    ("a reserved packet type", b"\x00\x00"),
    ("a truncated CONNECT", b"\x10\x20\x00\x04MQTT\x05"),
    ("an oversized CONNECT", b"\x10\xff\xff\xff\x7f" + b"\x00" * 1024),
    ("a malformed length", b"\x10\xff\xff\xff\xff\x01"),
    ("HTTP on the MQTT port", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
])
def test_bad_mqtt_input_is_closed(swept, name, payload):
    answer = exchange(swept.address(P), swept.config.ports.mqtt, payload)
    assert len(answer) <= 16, f"{name}: answered {answer!r}"  # nothing, or a CONNACK/DISCONNECT with a reason
    assert_unharmed(swept)


def test_nothing_acknowledged_before_the_sweep_was_lost(swept):
    received, missing = resume_and_collect(swept.address(P), swept.acked)
    assert missing == [], f"lost {missing} of {len(swept.acked)} acknowledged messages"
    assert_unharmed(swept)
