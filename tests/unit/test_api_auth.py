"""The management API's authentication middleware (appliance/api/auth.py) and admin file, in process.

The middleware runs in a real aiohttp app behind a real socket (aiohttp's
TestServer on this work tree's primary loopback address, a free port), in
front of a route registered after it the way the status page and /metrics
are: whatever is added later is covered. The limiter is sans-I/O and is
stepped with explicit times.
"""

import asyncio
import base64
import json
import os
import stat

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pairmq.appliance.api.admin_credential import AdminFile, new_credential, read_admin, write_admin
from pairmq.appliance.api.auth import PRINCIPAL, ApiAuth, FailureLimiter, auth_middleware
from pairmq.appliance.errors import ConfigError
from pairmq.appliance.roles import Role
from pairmq.cli.api import signed_headers
from tests.harness.group import LOOPBACK

KEY = bytes.fromhex("ab" * 32)
PASSWORD = "correct horse battery"


def basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def run_app(tmp_path, body, *, limiter: FailureLimiter | None = None, admin: bool = True):
    """Serve an app with the real middleware and two routes; run `body(session, url, auth)`."""
    path = tmp_path / "admin"
    if admin:
        write_admin(path, new_credential("admin", PASSWORD))
    auth = ApiAuth(KEY, AdminFile(path), limiter)

    async def main():
        app = web.Application(middlewares=[auth_middleware(auth)])
        async def redundancy(request):
            return web.json_response({"who": request[PRINCIPAL]})

        async def status_page(request):
            return web.Response(text="status page")

        app.router.add_get("/api/v1/redundancy", redundancy)
        app.router.add_get("/", status_page)  # "added later"
        server = TestServer(app, host=LOOPBACK[Role.PRIMARY], port=0)
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                return await body(session, str(server.make_url("")), auth)
        finally:
            await server.close()
            auth.close()

    return asyncio.run(main())


def signed(url, path="/api/v1/redundancy", method="GET", body=b"", key=KEY) -> dict:
    return signed_headers(key.hex(), method, url + path, body)


async def call(session, url, path="/api/v1/redundancy", headers=None):
    headers = headers(url, path) if callable(headers) else headers
    async with session.get(url + path, headers=headers or {}) as r:
        text = await r.text()
        return r.status, text, r.headers


def test_every_route_needs_a_credential_and_401_names_both_schemes(tmp_path):
    async def body(session, url, auth):
        for path in ("/api/v1/redundancy", "/", "/no/such/route"):
            status, text, headers = await call(session, url, path)
            assert status == 401, path
            assert json.loads(text)["error"].startswith("authentication required")
            assert headers.getall("WWW-Authenticate") == ['Basic realm="PairMQ management", charset="UTF-8"',
                                                          'PairMQ-HMAC realm="PairMQ management"']
        assert (await call(session, url, "/", signed))[:2] == (200, "status page")
        status, text, _ = await call(session, url, headers=signed)
        assert (status, json.loads(text)) == (200, {"who": "key"})
        status, text, _ = await call(session, url, headers=basic("admin", PASSWORD))
        assert (status, json.loads(text)) == (200, {"who": "admin:admin"})
        assert (await call(session, url, "/no/such/route", signed))[0] == 404

    run_app(tmp_path, body)


@pytest.mark.parametrize("header, fragment", [
    (f"Bearer {'cd' * 24}", "bearer tokens are not accepted"),
    ("Bearer", "bearer tokens are not accepted"),
    ("PairMQ-HMAC ts=1, nonce=00, sig=00", "not ts=, nonce=, sig="),
    (f"PairMQ-HMAC ts=1, nonce={'0' * 32}, sig={'0' * 64}", "away from this node's clock"),
    ("Bearer \xff" + "ab" * 24, "not ASCII"),
    ("Basic " + base64.b64encode(f"admin:{PASSWORD}x".encode()).decode(), "wrong admin user name or password"),
    ("Basic " + base64.b64encode(f"root:{PASSWORD}".encode()).decode(), "wrong admin user name or password"),
    ("Basic !!!notbase64", "not base64 of user:password"),
    ("Basic " + base64.b64encode(b"no-colon").decode(), "not base64 of user:password"),
    ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "not base64 of user:password"),
    ("Digest username=admin", "unsupported authentication scheme 'digest'"),
    ("Bearer " + "x" * 5000, "too long"),
])
def test_wrong_credentials_get_one_sentence_401(tmp_path, header, fragment):
    async def body(session, url, auth):
        status, text, headers = await call(session, url, headers={"Authorization": header})
        assert status == 401 and fragment in json.loads(text)["error"], text
        assert len(headers.getall("WWW-Authenticate")) == 2
        assert auth.counters["refused"] == 1

    run_app(tmp_path, body)


def test_basic_without_an_admin_file_points_at_the_cli(tmp_path):
    async def body(session, url, auth):
        status, text, _ = await call(session, url, headers=basic("admin", PASSWORD))
        assert status == 401 and "no admin password is set on this node" in json.loads(text)["error"]
        assert (await call(session, url, headers=signed))[0] == 200

    run_app(tmp_path, body, admin=False)


def test_a_changed_admin_file_takes_effect_and_a_broken_one_keeps_the_last_good(tmp_path):
    async def body(session, url, auth):
        assert (await call(session, url, headers=basic("admin", PASSWORD)))[0] == 200
        write_admin(auth.admin.path, new_credential("ops", "another long password"))
        assert (await call(session, url, headers=basic("admin", PASSWORD)))[0] == 401
        assert (await call(session, url, headers=basic("ops", "another long password")))[0] == 200
        auth.admin.path.write_text("{not json")
        assert (await call(session, url, headers=basic("ops", "another long password")))[0] == 200
        assert "is not JSON" in auth.admin.problem and "stays in force" in auth.admin.problem

    run_app(tmp_path, body)


def test_repeated_failures_throttle_that_credential_not_the_address(tmp_path):
    async def body(session, url, auth):
        for _ in range(3):
            assert (await call(session, url, headers=basic("admin", "a wrong password")))[0] == 401
        status, text, headers = await call(session, url, headers=basic("admin", "a wrong password"))
        assert status == 429, text
        assert json.loads(text)["error"].startswith("too many failed attempts with this credential")
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert (await call(session, url, headers=basic("admin", PASSWORD)))[0] == 200  # same address
        assert (await call(session, url, headers=signed))[0] == 200
        assert auth.counters["rate_limited"] == 1 and auth.counters["accepted"] == 2

    run_app(tmp_path, body, limiter=FailureLimiter(max_failures=3, window_ms=60_000))


def test_limiter_window_reset_and_bounded_table():
    limiter = FailureLimiter(max_failures=2, window_ms=1000, max_keys=3)
    limiter.failed("a", 0)
    assert limiter.retry_after_ms("a", 10) is None
    limiter.failed("a", 100)
    assert limiter.retry_after_ms("a", 400) == 600
    assert limiter.retry_after_ms("b", 400) is None
    assert limiter.retry_after_ms("a", 1000) is None  # the window ended: forgiven, and forgotten
    assert len(limiter) == 0
    limiter.failed("a", 2000)
    limiter.succeeded("a")
    assert len(limiter) == 0
    for i in range(10_000):  # a spray of credentials keeps at most max_keys entries
        limiter.failed(f"10.0.{i // 256}.{i % 256}", 3000 + i)
    assert len(limiter) == 3


def test_admin_file_is_private_and_bad_files_are_one_sentence(tmp_path):
    path = tmp_path / "admin"
    write_admin(path, new_credential("admin", PASSWORD))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert PASSWORD not in path.read_text() and doc["password"]["scheme"] == "scrypt"
    assert read_admin(tmp_path / "missing") is None
    for text, fragment in (("[]", "must be {version: 1, username, password}"),
                           ('{"version": 1, "username": "a", "password": {"scheme": "md5"}}', "scheme"),
                           ("{", "is not JSON")):
        path.write_text(text)
        with pytest.raises(ConfigError, match="admin credential") as refused:
            AdminFile(path)
        assert fragment in str(refused.value)
    with pytest.raises(ConfigError, match="at least 12 characters"):
        new_credential("admin", "short")


def test_requests_without_a_credential_are_not_counted_as_guesses(tmp_path):
    """A browser's first request carries none; only wrong credentials count towards the limit."""
    async def body(session, url, auth):
        for _ in range(5):
            assert (await call(session, url))[0] == 401
        assert (await call(session, url, headers=signed))[0] == 200

    run_app(tmp_path, body, limiter=FailureLimiter(max_failures=2, window_ms=60_000))


def test_any_authorization_header_is_refused_cleanly(tmp_path):
    """Whatever a client puts in the header, bytes that are not ASCII included: Refused(401) with one
    sentence (or the admin's principal for its one real Basic value); never another exception."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from aiohttp.test_utils import make_mocked_request

    from pairmq.appliance.api.auth import Refused

    request = make_mocked_request("GET", "/api/v1/redundancy", headers={"Host": "127.0.0.1:8080"})
    path = tmp_path / "admin"
    write_admin(path, new_credential("admin", PASSWORD))
    auth = ApiAuth(KEY, AdminFile(path), FailureLimiter(max_failures=10**9))
    loop = asyncio.new_event_loop()
    latin1 = st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=200) | st.binary(max_size=200).map(
        lambda b: b.decode("utf-8", "surrogateescape"))  # how aiohttp hands over a header's raw bytes
    b64 = st.binary(max_size=100).map(lambda b: base64.b64encode(b).decode())

    @settings(max_examples=300, deadline=None)
    @given(st.one_of(latin1, latin1.map(lambda t: "Bearer " + t), latin1.map(lambda t: "Basic " + t),
                     latin1.map(lambda t: "PairMQ-HMAC " + t), b64.map(lambda t: "Basic " + t)))
    def check(header):
        try:
            principal = loop.run_until_complete(auth._verify(header, request))
        except Refused as exc:
            assert exc.status == 401 and str(exc) and "\n" not in str(exc)
        else:
            assert principal == "admin:admin"

    try:
        check()
    finally:
        loop.close()
        auth.close()


def test_signed_request_checks_run_in_order_and_nonces_are_spent_within_the_window():
    """request_signing.Verifier, stepped with explicit wall-clock times: malformed, stale, another node,
    bad MAC, replay; a nonce is remembered only after its MAC verified, and forgotten once its request
    would be stale anyway; the table is bounded."""
    from pairmq.appliance.api.signing import SignatureRefused, Verifier, sign

    hosts = {"10.0.0.1:8080"}

    def check(verifier, header, now, key=KEY, host="10.0.0.1:8080", body=b"{}"):
        verifier.verify(header.partition(" ")[2], [key], "POST", hosts, host, "/api/v1/x", body, now)

    v = Verifier(window_ms=1000, max_nonces=2)
    h = sign(KEY, "POST", "10.0.0.1:8080", "/api/v1/x", b"{}", 5000, b"\x01" * 16)
    for kwargs, fragment in ((dict(now=7000), "away from this node's clock"),
                             (dict(now=5000, host="10.0.0.2:8080"), "another node"),
                             (dict(now=5000, key=b"k" * 32), "does not verify"),
                             (dict(now=5000, body=b"{ }"), "does not verify")):
        with pytest.raises(SignatureRefused, match=fragment):
            check(v, h, **kwargs)
    assert len(v) == 0  # nothing refused was remembered
    check(v, h, 5000)
    with pytest.raises(SignatureRefused, match="replay"):
        check(v, h, 5500)
    h2 = sign(KEY, "POST", "10.0.0.1:8080", "/api/v1/x", b"{}", 5100, b"\x02" * 16)
    check(v, h2, 5100)
    h3 = sign(KEY, "POST", "10.0.0.1:8080", "/api/v1/x", b"{}", 5200, b"\x03" * 16)
    with pytest.raises(SignatureRefused, match="too many signed requests"):
        check(v, h3, 5200)
    check(v, sign(KEY, "POST", "10.0.0.1:8080", "/api/v1/x", b"{}", 6050, b"\x03" * 16), 6050)  # h is forgotten
    assert len(v) == 2


def test_connection_caps_in_total_and_per_address():
    from pairmq.appliance.api.listener import ConnectionCaps

    caps = ConnectionCaps(max_total=3, max_per_address=2)
    assert caps.admit("a1", "10.0.0.9") and caps.admit("a2", "10.0.0.9")
    assert not caps.admit("a3", "10.0.0.9") and caps.refused_per_address == 1
    assert caps.admit("b1", "10.0.0.8")
    assert not caps.admit("c1", "10.0.0.7") and caps.refused_total == 1
    caps.release("a1")
    caps.release("a1")  # twice is harmless
    assert caps.admit("a3", "10.0.0.9") and len(caps) == 3
    for connection in ("a2", "a3", "b1"):
        caps.release(connection)
    assert caps.view()["open"] == 0 and caps.view()["addresses"] == 0


def test_management_settings_round_trip_and_bad_ones_are_one_sentence(tmp_path):
    import tomllib

    from pairmq.appliance.config import GroupConfig, NodeSpec, parse_group, render_group
    from pairmq.appliance.management_settings import ManagementSettings, make_self_signed

    make_self_signed(tmp_path / "m.pem", tmp_path / "m.key", ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "g")
    nodes = {r: NodeSpec(r, f"10.0.0.{i + 1}", tmp_path / r.value) for i, r in enumerate(Role)}
    settings = ManagementSettings(idle_timeout_ms=5000, max_connections=100, max_connections_per_address=10,
                                  cert_file=tmp_path / "m.pem", key_file=tmp_path / "m.key")
    text = render_group(GroupConfig("g", nodes, tmp_path / "secret", management=settings))
    assert parse_group(tomllib.loads(text), tmp_path / "group.toml").management == settings
    assert "[management]" not in render_group(GroupConfig("g", nodes, tmp_path / "secret"))
    base = render_group(GroupConfig("g", nodes, tmp_path / "secret"))
    for table, fragment in (("idle_timeout_ms = 0", "management.idle_timeout_ms must be a whole number"),
                            ("max_connections = 10\nmax_connections_per_address = 20", "at most management.max_conn"),
                            ('cert_file = "m.pem"', "needs both cert_file and key_file"),
                            ('cert_file = "m.pem"\nkey_file = "nothing.key"', "management.key_file"),
                            ("keepalive = 1", "unknown key 'keepalive' in [management]")):
        with pytest.raises(ConfigError, match="management") as refused:
            parse_group(tomllib.loads(base + "\n[management]\n" + table + "\n"), tmp_path / "group.toml")
        assert fragment in str(refused.value) and "\n" not in str(refused.value)
