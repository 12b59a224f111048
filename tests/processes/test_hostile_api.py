"""The management API against a hostile network (docs/security.md), on one live group of node
processes serving the API over HTTPS with the self-signed certificate `pairmq init --management-tls`
makes: connections that never finish a request head, too many connections from one address, a
cross-site POST riding a browser's cached admin login, captured/forged/tampered signed requests, a
credential with a byte that is not ASCII, and the browser admin reaching for password records and
secret rotation. The CLI runs end to end against the group (HTTPS, certificate pinned).

Nothing here asserts a duration: deadlines are only how long to wait before giving up.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time

import pytest

from pairmq.appliance.api.admin_credential import admin_path, new_credential, write_admin
from pairmq.appliance.config import load_secret
from pairmq.appliance.management_settings import ManagementSettings, client_context, make_self_signed
from pairmq.appliance.keyring import management_token
from pairmq.appliance.roles import Role
from pairmq.cli.api import signed_headers
from tests.harness.group import LOOPBACK, REPO, active_group

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
IDLE_MS = 1000
PER_ADDRESS = 8
ADMIN_PASSWORD = "the admin's long password"
GIVE_UP_S = 20.0


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hostile-api") / "group"
    directory.mkdir(parents=True)
    make_self_signed(directory / "management.pem", directory / "management.key", list(LOOPBACK.values()), "test")
    settings = ManagementSettings(idle_timeout_ms=IDLE_MS, body_timeout_ms=IDLE_MS,
                                  max_connections_per_address=PER_ADDRESS,
                                  cert_file=directory / "management.pem", key_file=directory / "management.key")
    with active_group(directory, management=settings) as g:
        write_admin(admin_path(g.config), new_credential("admin", ADMIN_PASSWORD))
        yield g


def context(g) -> ssl.SSLContext:
    return client_context(g.config.management)


def netloc(g, role: Role) -> str:
    return f"{g.address(role)}:{g.config.ports.management}"


def request(g, role: Role, method: str, path: str, headers: dict, body: bytes | None = None,
            source: str | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPSConnection(g.address(role), g.config.ports.management, timeout=10, context=context(g),
                                       source_address=(source, 0) if source else None)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def signed(g, role: Role, method: str, path: str, body: bytes = b"", key: str | None = None) -> dict:
    key = key or management_token(load_secret(g.config))
    return signed_headers(key, method, f"https://{netloc(g, role)}{path}", body)


def basic(password: str = ADMIN_PASSWORD) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()}


def config_version(g) -> int:
    return request(g, P, "GET", "/api/v1/config", signed(g, P, "GET", "/api/v1/config"))[1]["version"]


def closed_by_server(sock: socket.socket, give_up_s: float) -> bool:
    """Whether the server closed (or reset) the connection before `give_up_s`; reads and drops what comes."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + give_up_s
    while time.monotonic() < deadline:
        try:
            if sock.recv(4096) == b"":
                return True
        except (socket.timeout, ssl.SSLWantReadError):
            continue
        except (ConnectionResetError, ssl.SSLError, OSError):
            return True
    return False


def tls_socket(g, role: Role, source: str) -> ssl.SSLSocket:
    raw = socket.create_connection((g.address(role), g.config.ports.management), timeout=5, source_address=(source, 0))
    return context(g).wrap_socket(raw, server_hostname=g.address(role))


def pairmq(g, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *args, "--group", str(g.dir / "group.toml")],
                          capture_output=True, text=True, timeout=30, cwd=REPO,
                          env={k: v for k, v in os.environ.items() if k != "PAIRMQ_TOKEN"})


# --- connections that never finish a request head, and too many from one address ------------------


def test_silent_and_slowloris_connections_are_closed_while_the_operator_gets_in(group):
    source = LOOPBACK[M]
    silent = [socket.create_connection((group.address(P), 8080), timeout=5, source_address=(source, 0))
              for _ in range(3)]  # not even a TLS ClientHello
    quiet = [tls_socket(group, P, source) for _ in range(2)]  # a handshake, then nothing
    slow = [tls_socket(group, P, source) for _ in range(3)]
    for sock in slow:
        sock.sendall(b"GET /api/v1/redundancy HTTP/1.1\r\nHost: x\r\n")
    # The operator, meanwhile, from another address: signed, answered.
    assert request(group, P, "GET", "/api/v1/redundancy", signed(group, P, "GET", "/api/v1/redundancy"))[0] == 200
    deadline = time.monotonic() + GIVE_UP_S
    open_slow = list(slow)
    while open_slow and time.monotonic() < deadline:  # a header byte at a time, never the end of the head
        for sock in list(open_slow):
            try:
                sock.sendall(b"X")
            except OSError:
                open_slow.remove(sock)
        time.sleep(0.1)
    assert not open_slow, "a slowloris connection was still open after the give-up bound"
    for sock in silent + quiet + slow:
        assert closed_by_server(sock, GIVE_UP_S)
        sock.close()


def test_a_body_that_trickles_in_is_answered_408(group):
    body = json.dumps({"changes": [{"kind": "anonymous.set", "allowed": True}]}).encode()
    sock = tls_socket(group, P, LOOPBACK[M])
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in signed(group, P, "POST", "/api/v1/config/changes", body).items())
        sock.sendall(f"POST /api/v1/config/changes HTTP/1.1\r\nHost: {netloc(group, P)}\r\n{head}"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:5])
        sock.settimeout(GIVE_UP_S)
        assert sock.recv(12) == b"HTTP/1.1 408"
    finally:
        sock.close()


def test_connections_past_the_per_address_cap_are_reset_and_others_still_served(group):
    source = LOOPBACK[B]
    held = [tls_socket(group, P, source) for _ in range(PER_ADDRESS)]
    try:
        with pytest.raises((ConnectionResetError, ssl.SSLError, OSError)):
            extra = tls_socket(group, P, source)  # the server resets it once the handshake is done
            extra.sendall(b"GET /api/v1/redundancy HTTP/1.1\r\nHost: x\r\n\r\n")
            if extra.recv(1) == b"":
                raise ConnectionResetError("closed")
        status, doc = request(group, P, "GET", "/api/v1", signed(group, P, "GET", "/api/v1"))
        assert status == 200 and doc["connections"]["refused_address_cap"] >= 1
    finally:
        for sock in held:
            sock.close()


# --- a cross-site POST riding the browser's cached admin login ---------------------------------


def test_a_cross_site_text_plain_post_with_basic_is_refused_and_changes_nothing(group):
    before = config_version(group)
    body = json.dumps({"changes": [{"kind": "anonymous.set", "allowed": False}]}).encode()
    for extra in ({"Content-Type": "text/plain", "Origin": "http://evil.example"},
                  {"Content-Type": "application/json", "Origin": "http://evil.example"},
                  {"Content-Type": "text/plain", "Origin": f"https://{netloc(group, P)}"},
                  {"Content-Type": "application/json"}):
        status, doc = request(group, P, "POST", "/api/v1/config/changes", {**basic(), **extra}, body)
        assert status == 403, (extra, doc)
    assert config_version(group) == before
    # The status page's own origin, with JSON, is the browser admin's legitimate change.
    status, doc = request(group, P, "POST", "/api/v1/config/changes",
                          {**basic(), "Content-Type": "application/json", "Origin": f"https://{netloc(group, P)}"},
                          json.dumps({"changes": [{"kind": "anonymous.set", "allowed": True}]}).encode())
    assert status == 200 and doc["version"] == before + 1


# --- signed requests; replayed, forged, tampered, sent to another node ------------------------


def test_signed_requests_cannot_be_replayed_forged_tampered_or_redirected(group):
    body = json.dumps({"changes": [{"kind": "anonymous.set", "allowed": True}]}).encode()
    path = "/api/v1/config/changes"
    json_type = {"Content-Type": "application/json"}
    captured = signed(group, P, "POST", path, body)
    assert "PairMQ-HMAC" in captured["Authorization"]
    assert management_token(load_secret(group.config)) not in captured["Authorization"]
    before = config_version(group)
    assert request(group, P, "POST", path, {**captured, **json_type}, body)[0] == 200
    status, doc = request(group, P, "POST", path, {**captured, **json_type}, body)
    assert status == 401 and "replay" in doc["error"]
    wrong_key = signed(group, P, "POST", path, body, key=os.urandom(32).hex())
    status, doc = request(group, P, "POST", path, {**wrong_key, **json_type}, body)
    assert status == 401 and "does not verify" in doc["error"]
    fresh = signed(group, P, "POST", path, body)
    tampered = body.replace(b"true", b"false")
    status, doc = request(group, P, "POST", path, {**fresh, **json_type}, tampered)
    assert status == 401 and "does not verify" in doc["error"]
    for_primary = signed(group, P, "GET", "/api/v1/redundancy")  # replayed to the backup, Host and all
    status, doc = request(group, B, "GET", "/api/v1/redundancy", {**for_primary, "Host": netloc(group, P)})
    assert status == 401 and "another node" in doc["error"]
    status, doc = request(group, B, "GET", "/api/v1/redundancy", for_primary)  # the backup's Host: not signed
    assert status == 401 and "does not verify" in doc["error"]
    assert config_version(group) == before + 1  # only the one genuine request changed anything


def test_the_cli_works_end_to_end_over_https_and_refuses_another_certificate(group, tmp_path):
    done = pairmq(group, "show", "redundancy", "--json")
    assert done.returncode == 0, done.stderr
    nodes = json.loads(done.stdout)["nodes"]
    assert all(n["reachable"] for n in nodes), nodes
    done = pairmq(group, "config", "anonymous", "allow")
    assert done.returncode == 0, done.stderr
    # The status page's fan-out reaches both peers the same way (signed, certificate verified).
    status, doc = request(group, P, "GET", "/api/v1/group", basic())
    assert status == 200 and all(n["reachable"] for n in doc["nodes"]), doc
    # Prometheus scrapes /metrics the same way: Basic over HTTPS, the certificate as its CA file.
    conn = http.client.HTTPSConnection(group.address(P), 8080, timeout=10, context=context(group))
    try:
        conn.request("GET", "/metrics", headers=basic())
        response = conn.getresponse()
        assert response.status == 200 and b"pairmq_active 1" in response.read()
    finally:
        conn.close()
    # A CLI whose group file trusts another certificate refuses to talk (no silent fallback).
    other = tmp_path / "other"
    other.mkdir()
    make_self_signed(other / "management.pem", other / "management.key", list(LOOPBACK.values()), "other")
    text = (group.dir / "group.toml").read_text().replace(str(group.dir / "management.pem"),
                                                         str(other / "management.pem"))
    text = text.replace(str(group.dir / "management.key"), str(other / "management.key"))
    (other / "group.toml").write_text(text)  # the same secret (an absolute path): only the trust differs
    done = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "show", "redundancy", "--json", "--group",
                           str(other / "group.toml")], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode != 0 and "certificate verify failed" in done.stderr, done.stderr


# --- bad bytes; what the browser admin may not do -----------------------------------


def test_a_credential_with_a_byte_that_is_not_ascii_is_a_counted_401_and_no_traceback(group):
    sock = tls_socket(group, P, LOOPBACK[P])
    answers = []
    try:
        for _ in range(11):
            sock.sendall(b"GET /api/v1/redundancy HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe"
                         + b"ab" * 24 + b"\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            body = b""
            while len(body) < length:
                body += sock.recv(length - len(body))
            answers.append((int(head.split(b" ")[1]), json.loads(body)["error"]))
    finally:
        sock.close()
    assert answers[0] == (401, "the Authorization header has bytes that are not ASCII")
    assert [status for status, _ in answers] == [401] * 10 + [429]  # counted by the limiter
    log = (group.dir / "primary.log").read_text(errors="replace")
    assert "Traceback" not in log and "Error handling request" not in log


def test_the_browser_admin_cannot_read_password_records_nor_drive_secret_rotation(group):
    status, doc = request(group, P, "GET", "/api/v1/config/document", basic())
    assert status == 403 and "password records" in doc["error"]
    step = json.dumps({"step": "use", "key_id": 0}).encode()
    browser = {**basic(), "Content-Type": "application/json", "Origin": f"https://{netloc(group, P)}"}
    status, doc = request(group, P, "POST", "/api/v1/secret/steps", browser, step)
    assert status == 403 and "secret rotation step" in doc["error"]
    # The key holder (the CLI) still may.
    path = "/api/v1/config/document"
    assert request(group, P, "GET", path, signed(group, P, "GET", path))[0] == 200
    status, doc = request(group, P, "POST", "/api/v1/secret/steps",
                          {**signed(group, P, "POST", "/api/v1/secret/steps", step),
                           "Content-Type": "application/json"}, step)
    assert status == 200 and doc["changed"] is False


def test_init_with_management_tls_makes_a_pinned_certificate_for_the_three_addresses(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "init", "--dir", str(tmp_path), "--management-tls",
                           "--primary", "10.0.0.1", "--backup", "10.0.0.2", "--monitor", "10.0.0.3",
                           "--admin-password-stdin"], input=ADMIN_PASSWORD + "\n", capture_output=True, text=True,
                          timeout=30, cwd=REPO)
    assert done.returncode == 0, done.stderr
    from cryptography import x509

    from pairmq.appliance.config import load_group

    config = load_group(tmp_path / "group.toml")
    assert config.management.https and config.management.trust_file == tmp_path / "management.pem"
    assert oct((tmp_path / "management.key").stat().st_mode & 0o777) == "0o600"
    cert = x509.load_pem_x509_certificate((tmp_path / "management.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(str(a) for a in names.get_values_for_type(x509.IPAddress)) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert "[management]" in (tmp_path / "group.toml").read_text() and 'cert_file = "management.pem"' in (
        tmp_path / "group.toml").read_text()
