"""A small client for the nodes' management API (DESIGN §1: port 8080).

Stdlib only (urllib + one thread per node), so a CLI call opens no event loop
and every request closes its connection. Each request is signed with the
group's management key (appliance/api/signing.py): the key never travels,
and a captured request is good for that one request to that one node. Over
HTTPS the node's certificate is verified against the group file's
management.ca_file, by default the node certificate itself (pinned). Proxies from the environment are
ignored: the management API is always reached directly. Errors are sentences:
a node's JSON `{"error": ...}` is surfaced as is, a connection failure says
what happened (refused, no answer within the timeout).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

from pairmq.appliance.config import GroupConfig, load_secret
from pairmq.appliance.errors import ConfigError, PairMQError
from pairmq.appliance.keyring import management_token
from pairmq.appliance.management_settings import client_context
from pairmq.appliance.api.signing import sign
from pairmq.appliance.roles import Role

READ_TIMEOUT_S = 1.0
UNAUTHORIZED = 401
MAX_RESPONSE_BYTES = 1 << 20
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TOKEN_ENV = "PAIRMQ_TOKEN"  # the management key (hex), for a host where the operator cannot read the group secret
_trusted: dict[str, ssl.SSLContext] = {}  # "https://host:port" -> what its certificate is verified against


class ApiError(PairMQError):
    """A node answered with an error, or with something that is not the API."""

    status: int | None = None  # the HTTP status of an error answer


class NodeUnreachable(ApiError):
    """No HTTP answer at all: refused, timed out, no route."""


def base_url(config: GroupConfig, role: Role) -> str:
    """The node's API address; for HTTPS, also what this process will verify its certificate against."""
    address = config.node(role).address
    host = f"[{address}]" if ":" in address else address
    url = f"{config.management.scheme}://{host}:{config.ports.management}"
    if config.management.https and url not in _trusted:
        _trusted[url] = client_context(config.management)
    return url


def signed_headers(token: str, method: str, url: str, body: bytes = b"") -> dict:
    """The Authorization header of one request to `url`, signed with the management key `token` (hex)."""
    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        key = bytes.fromhex(token)
    except ValueError:
        raise ConfigError(f"${TOKEN_ENV} must be the group's management key in hex") from None
    return {"Authorization": sign(key, method, parts.netloc, path, body, time.time_ns() // 1_000_000,
                                  os.urandom(16))}


def _context(url: str) -> ssl.SSLContext | None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        return None
    trusted = _trusted.get(f"https://{parts.netloc}")
    if trusted is None:
        raise ConfigError(f"{url}: no certificate to verify it against (the group file's [management] names none)")
    return trusted


def token(config: GroupConfig) -> str:
    """The management key (hex) every request is signed with: $PAIRMQ_TOKEN, else derived from the group secret."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    try:
        return management_token(load_secret(config))
    except ConfigError as exc:
        raise ConfigError(f"{exc} (the CLI signs its requests with the token derived from it; run as a user "
                          f"who can read it, or set ${TOKEN_ENV})") from None


def get_json(url: str, *, timeout_s: float = READ_TIMEOUT_S, token: str | None = None) -> dict:
    headers = {"Accept": "application/json"} | (signed_headers(token, "GET", url) if token else {})
    return _call(urllib.request.Request(url, headers=headers), timeout_s)


def post_json(url: str, body: dict, *, token: str, timeout_s: float = READ_TIMEOUT_S) -> dict:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Accept": "application/json", "Content-Type": "application/json", **signed_headers(token, "POST", url, data)})
    return _call(request, timeout_s)


def _call(request: urllib.request.Request, timeout_s: float) -> dict:
    context = _context(request.full_url)
    opener = _opener if context is None else urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return _decode(response.read(MAX_RESPONSE_BYTES + 1), request.full_url)
    except urllib.error.HTTPError as exc:
        with exc:
            body = exc.read(MAX_RESPONSE_BYTES + 1)
        try:
            message = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            message = f"{request.full_url} answered HTTP {exc.code} {exc.reason}"
        if exc.code == UNAUTHORIZED:
            # Not "unreachable": the node answered, and the operator must fix the token, not the network.
            message = f"the management token was refused by {urllib.parse.urlsplit(request.full_url).netloc} " \
                      f"({UNAUTHORIZED}: {message})"
        error = ApiError(str(message))
        error.status = exc.code
        raise error from None
    except urllib.error.URLError as exc:
        raise NodeUnreachable(_describe(exc.reason, timeout_s)) from None
    except (TimeoutError, socket.timeout) as exc:
        raise NodeUnreachable(_describe(exc, timeout_s)) from None
    except OSError as exc:
        raise NodeUnreachable(_describe(exc, timeout_s)) from None


def _decode(body: bytes, url: str) -> dict:
    if len(body) > MAX_RESPONSE_BYTES:
        raise ApiError(f"{url} answered with more than {MAX_RESPONSE_BYTES} bytes")
    try:
        document = json.loads(body)
    except ValueError:
        raise ApiError(f"{url} answered with something that is not JSON") from None
    if not isinstance(document, dict):
        raise ApiError(f"{url} answered with JSON that is not an object")
    return document


def _describe(reason: object, timeout_s: float) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is the node running?)"
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"no answer within {timeout_s:g} s"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror[0].lower() + reason.strerror[1:]
    return str(reason)


# --- the redundancy view of a whole group -----------------------------------------


def fetch_redundancy(config: GroupConfig, *, timeout_s: float = READ_TIMEOUT_S) -> list[dict]:
    """Every node's redundancy view, primary/backup/monitor order, asked concurrently.

    A node that does not answer is an entry `{"role", "address", "reachable":
    false, "error"}`; one that does gets `"reachable": true` added to its view.
    """
    roles, key = list(Role), token(config)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(roles)) as pool:
        futures = [pool.submit(_fetch_one, config, role, timeout_s, key) for role in roles]
        return [future.result() for future in futures]


def _fetch_one(config: GroupConfig, role: Role, timeout_s: float, key: str) -> dict:
    address = config.node(role).address
    try:
        view = get_json(f"{base_url(config, role)}/api/v1/redundancy", timeout_s=timeout_s, token=key)
    except ApiError as exc:
        return {"role": role.value, "address": address, "reachable": False, "error": str(exc),
                **({"status": exc.status} if exc.status is not None else {})}
    return {**view, "reachable": True}


def redundancy_document(config: GroupConfig, nodes: list[dict]) -> dict:
    """The stable `--json` document of `pairmq show redundancy`."""
    return {"schema": 1, "group": config.name, "nodes": nodes}


def refused_token(nodes: list[dict]) -> list[str]:
    """The roles of the nodes that answered 401 to our signed request."""
    return [n["role"] for n in nodes if not n["reachable"] and n.get("status") == UNAUTHORIZED]


def require_one_reachable(config: GroupConfig, nodes: list[dict]) -> None:
    if any(node["reachable"] for node in nodes):
        return
    if refused := refused_token(nodes):
        others = "; ".join(f"the {n['role']}: {n['error']}" for n in nodes if n["role"] not in refused)
        raise token_refused(config, refused, others)
    details = "; ".join(f"{n['role']} at {base_url(config, Role(n['role']))}: {n['error']}" for n in nodes)
    raise NodeUnreachable(f"no node of group {config.name!r} answered ({details})")


def token_refused(config: GroupConfig, roles: list[str], others: str = "") -> ApiError:
    """Every node that answered refused our signature: the operator's secret or $PAIRMQ_TOKEN is wrong."""
    who = ", ".join(roles[:-1]) + (" and " if len(roles) > 1 else "") + roles[-1]
    error = ApiError(f"the management token was refused by the {who} ({UNAUTHORIZED}): the group secret "
                     f"{config.secret_file} (or ${TOKEN_ENV}) is not this group's" + (f"; {others}" if others else ""))
    error.status = UNAUTHORIZED
    return error


def force_activity(config: GroupConfig, role: Role, token: str, *, timeout_s: float = 5.0) -> dict:
    return redundancy_action(config, role, "force-activity", {"acknowledge_data_loss": True}, token,
                             timeout_s=timeout_s)


def redundancy_action(config: GroupConfig, role: Role, action: str, body: dict, token: str, *,
                      timeout_s: float = 5.0) -> dict:
    """POST /api/v1/redundancy/<action> on one node; a refusal is the node's own sentence."""
    url = f"{base_url(config, role)}/api/v1/redundancy/{action}"
    try:
        return post_json(url, body, token=token, timeout_s=timeout_s)
    except NodeUnreachable as exc:
        raise NodeUnreachable(f"cannot reach the {role.value} node at {base_url(config, role)}: {exc}") from None
    except ApiError as exc:
        raise ApiError(f"the {role.value} node refused: {exc}") from None


# --- the decision stream (server-sent events) ----------------------------------------

STREAM_CONNECT_TIMEOUT_S = 1.0
STREAM_READ_TIMEOUT_S = 40.0  # the node sends a keep-alive every 15 s: silence this long is a dead stream


def open_stream(url: str, *, token: str, last_event_id: str | None = None,
                timeout_s: float = STREAM_CONNECT_TIMEOUT_S):
    """GET a text/event-stream: an open `EventStream`.

    `timeout_s` bounds the connection and the answer's headers; after that a read waits up to
    STREAM_READ_TIMEOUT_S (the keep-alives come every 15 s). Errors as `get_json`'s.
    """
    parts = urllib.parse.urlsplit(url)
    context = _context(url)
    connection = (http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s) if context is None
                  else http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=timeout_s,
                                                   context=context))
    headers = {"Accept": "text/event-stream", **signed_headers(token, "GET", url)} | (
        {"Last-Event-ID": last_event_id} if last_event_id else {})
    try:
        connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
        response = connection.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise NodeUnreachable(_describe(exc, timeout_s)) from None
    if response.status != 200:
        body = response.read(MAX_RESPONSE_BYTES + 1)
        connection.close()
        try:
            message = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            message = f"{url} answered HTTP {response.status} {response.reason}"
        raise ApiError(str(message))
    if not (response.getheader("Content-Type") or "").startswith("text/event-stream"):
        connection.close()
        raise ApiError(f"{url} answered with something that is not an event stream")
    connection.sock.settimeout(STREAM_READ_TIMEOUT_S)
    return EventStream(connection, response)


class EventStream:
    """An open text/event-stream. `close()` may be called from another thread than the one reading."""

    def __init__(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self._connection, self._response = connection, response
        self.status = response.status
        self.content_type = response.getheader("Content-Type") or ""
        self._events = self._read()

    def events(self):
        """(event, id, data) for each event until the stream ends. The same iterator every time, so a reader
        may stop after some events and go on later; the connection is closed at the end."""
        return self._events

    def _read(self):
        try:
            yield from sse_events(self._response)
        finally:
            self._connection.close()

    def close(self) -> None:
        """Ends the stream: a reader blocked in `events()` sees its end (closing the reader's file under it
        from here would wait for its lock, forever on a quiet stream, so only the socket is shut down)."""
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def sse_events(lines):
    """(event, id, data) for each event in an iterable of byte lines (the text/event-stream format)."""
    event, event_id, data = "message", None, []
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield event, event_id, "\n".join(data)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            event_id = value
