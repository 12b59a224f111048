"""`pairmq pub` and `pairmq sub`: mosquitto_pub/sub with a host list, on the host-list client.

Rules:
- The nodes: `--hosts H1[:P],H2[:P]`, or mosquitto's `-h HOST` (repeatable) and `-p PORT` (the port
  of a host given without one); without either, the group file's primary and backup MQTT addresses
  (their TLS port with TLS). Either command rides through a failover (cli/hostlist.py).
- TLS as mosquitto: `--cafile` (or `--capath`) verifies the server, `--cert`/`--key` present a client
  certificate, `--insecure` skips the host name check; TLS makes the default port 8883.
- A refusal no node would answer differently (bad user name or password, not authorized, banned, a
  protocol the server does not take) ends the command at once with exit 1, naming it in words; a
  timeout names the most relevant cause seen across the host list (a node's refusal before a
  standby's redirect).
- `pub` sends `-m MESSAGE`, `-f FILE` (the whole file), `-n` (an empty message), `-s` (all of stdin)
  or each line of stdin (`-l`), and returns once every message was acknowledged (QoS 1/2), or fails
  with one sentence after `--timeout` seconds.
- `sub` prints each payload and a newline (`-N`: none) (`-v`: "topic payload"; `-F`: a format, mosquitto's
  %t %p %q %r %l %m %I %U %% and \\n \\t \\\\; `--json`: one JSON object per message), skips retained
  messages with `-R`, and stops after `-C COUNT` messages, `-W SECONDS`, or at Ctrl-C. A subscription
  the server denies (SUBACK 0x80 or more) is exit 1 with the filter and the reason. A persistent
  session (`-c`, with `-i ID`) keeps messages queued while it is away.
- Payloads are printed as UTF-8 text, with undecodable bytes replaced.
"""

from __future__ import annotations

import argparse
import datetime
import queue
import re
import secrets
import ssl
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pairmq.appliance.errors import PairMQError

from .options import add_group, examples, group_path
from .terminal import Terminal

# cli/hostlist.py (paho-mqtt) is imported where a client is made: every command builds this module's parsers,
# and `pairmq node` (each node start) has no use for an MQTT client.
if TYPE_CHECKING:
    from .hostlist import HostListClient

MQTT_PORT, MQTT_TLS_PORT = 1883, 8883
POLL_S = 0.1  # how often a wait looks up from its queue for a refusal or Ctrl-C
VERSIONS = {"5": 5, "mqttv5": 5, "311": 4, "mqttv311": 4, "31": 3, "mqttv31": 3}
MAX_FILE_BYTES = 256 * 1024 * 1024  # MQTT's own payload limit is 256 MiB


def _tls(args) -> ssl.SSLContext | None:
    if not (args.cafile or args.capath or args.cert):
        return None
    if bool(args.cert) != bool(args.key):
        raise PairMQError("--cert and --key go together: the client certificate and its private key")
    try:
        context = ssl.create_default_context(cafile=args.cafile, capath=args.capath)
        if args.cert:
            context.load_cert_chain(args.cert, args.key)
    except (OSError, ssl.SSLError) as exc:
        raise PairMQError(f"cannot set up TLS: {getattr(exc, 'strerror', None) or exc}") from None
    if args.insecure:
        context.check_hostname = False
    return context


def _hosts(args, tls: bool) -> tuple[list[str], int]:
    """The host list and the port of a host named without one."""
    port = args.port or (MQTT_TLS_PORT if tls else MQTT_PORT)
    if args.hosts or args.host:
        return [*(args.hosts.split(",") if args.hosts else []), *(args.host or [])], port
    from pairmq.appliance.config import load_group
    from pairmq.appliance.roles import Role

    config = load_group(group_path(args))
    if tls:
        return [config.node(role).address for role in (Role.PRIMARY, Role.BACKUP)], port
    return [config.mqtt_reference(Role.PRIMARY), config.mqtt_reference(Role.BACKUP)], port


def _client(args, term: Terminal, prefix: str, subscriptions=(), **kwargs) -> HostListClient:
    """A started client; `subscriptions` (filter, qos, on_message) are registered before it connects, because
    a present session's queued messages arrive right after CONNACK and one without a callback would be lost."""
    from .hostlist import ClientError, HostListClient

    client_id = args.id or f"{prefix}-{secrets.token_hex(4)}"
    tls = _tls(args)
    hosts, port = _hosts(args, tls is not None)
    client = HostListClient(hosts, client_id, username=args.username, password=args.password,
                            keepalive_s=args.keepalive, protocol=VERSIONS[args.protocol_version], tls=tls,
                            fail_fast=True, default_port=port, **kwargs)
    for topic_filter, qos, on_message in subscriptions:
        client.subscribe(topic_filter, qos, on_message, whole_message=True)
    try:
        client.start(timeout_s=args.timeout)
    except ClientError as exc:
        raise PairMQError(str(exc)) from None
    finally:
        if args.debug:
            term.detail("\n".join(f"debug: {line}" for line in client.history))
    return client


def _payloads(args) -> list[bytes]:
    if args.lines:
        return [line.rstrip(b"\n") for line in sys.stdin.buffer]
    if args.stdin_file:
        return [sys.stdin.buffer.read(MAX_FILE_BYTES + 1)]
    if args.null_message:
        return [b""]
    if args.file is not None:
        try:
            with open(args.file, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise PairMQError(f"cannot read {args.file}: {exc.strerror or exc}") from None
        if len(data) > MAX_FILE_BYTES:
            raise PairMQError(f"{args.file} is larger than an MQTT message can be (256 MiB)")
        return [data]
    return [args.message.encode()]


def _refused(client: HostListClient) -> None:
    if client.failure is not None:
        raise PairMQError(client.failure)


def pub(args, term: Terminal) -> int:
    payloads = _payloads(args)
    client = _client(args, term, "pairmq-pub", session_expiry_s=60)
    try:
        handles = [client.publish(args.topic, p, qos=args.qos, retain=args.retain) for p in payloads]
        deadline = time.monotonic() + args.timeout
        for handle in handles:
            while not handle.wait(min(POLL_S, max(0.0, deadline - time.monotonic()))):
                _refused(client)
                if time.monotonic() >= deadline:
                    late = sum(not h.acknowledged.is_set() for h in handles)
                    raise PairMQError(f"{late} of {len(handles)} messages were not acknowledged within "
                                      f"{args.timeout:g} s")
    finally:
        client.stop()
    if client.failovers:
        term.note(f"sent {len(payloads)} message(s) across {client.failovers} failover(s)")
    term.record(topic=args.topic, sent=len(payloads), qos=args.qos, failovers=client.failovers)
    return 0


# --- sub: output formats ---

_FORMAT = re.compile(r"%[tpqrlmIU%]|\\[nt\\]")


def format_message(template: str, message, now: datetime.datetime) -> str:
    """mosquitto_sub's -F for the common subset: %t topic, %p payload, %q QoS, %r retained (0/1), %l payload
    length, %m message id, %I ISO 8601 time, %U Unix time with nanoseconds, %%; \\n, \\t and \\\\."""
    def one(match: re.Match) -> str:
        token = match.group(0)
        return {"%t": lambda: message.topic, "%p": lambda: message.payload.decode("utf-8", "replace"),
                "%q": lambda: str(message.qos), "%r": lambda: str(int(message.retain)),
                "%l": lambda: str(len(message.payload)), "%m": lambda: str(message.mid),
                "%I": lambda: now.isoformat(timespec="seconds"), "%U": lambda: f"{now.timestamp():.9f}",
                "%%": lambda: "%", "\\n": lambda: "\n", "\\t": lambda: "\t", "\\\\": lambda: "\\"}[token]()
    return _FORMAT.sub(one, template)


def _line(args, message) -> str:
    end = "" if args.no_eol else "\n"
    if args.format is not None:
        return format_message(args.format, message, datetime.datetime.now().astimezone()) + end
    text = message.payload.decode("utf-8", "replace")
    return f"{message.topic} {text}{end}" if args.verbose else f"{text}{end}"


def _check_subscriptions(client: HostListClient, timeout_s: float) -> None:
    from paho.mqtt.reasoncodes import ReasonCode
    from paho.mqtt.packettypes import PacketTypes

    from .hostlist import reason_words

    codes = client.wait_subscribed(timeout_s)
    _refused(client)
    if codes is None:
        raise PairMQError(f"the server did not answer the subscription within {timeout_s:g} s")
    denied = {f: c for f, c in codes.items() if c >= 0x80}
    if denied:
        raise PairMQError("the server denied the subscription to " + "; ".join(
            f"{f!r}: {reason_words(c, ReasonCode(PacketTypes.SUBACK, identifier=c).getName())}"
            for f, c in denied.items()))


def sub(args, term: Terminal) -> int:
    got: queue.Queue = queue.Queue()
    expiry = 3600 if args.persistent else 0
    client = _client(args, term, "pairmq-sub", [(f, args.qos, got.put) for f in args.topic],
                     session_expiry_s=expiry, message_ids=False)
    count = 0
    deadline = time.monotonic() + args.wait if args.wait else None
    try:
        _check_subscriptions(client, args.timeout)
        while args.count is None or count < args.count:
            try:
                message = got.get(timeout=POLL_S)
            except queue.Empty:
                _refused(client)
                if deadline is not None and time.monotonic() >= deadline:
                    break
                continue
            if args.no_retained and message.retain:
                continue
            if args.json:
                term.print_json_line({"topic": message.topic, "payload": message.payload.decode("utf-8", "replace"),
                                      "qos": message.qos, "retain": bool(message.retain)})
            else:
                term.out.file.write(_line(args, message))
                term.out.file.flush()
            count += 1
    except KeyboardInterrupt:
        pass
    finally:
        client.stop()
    term.record(received=count)
    return 0


# --- the parsers ---

def _version(text: str) -> str:
    if text.lower() not in VERSIONS:
        raise argparse.ArgumentTypeError(f"-V takes mqttv5, mqttv311 or mqttv31 (or 5, 311, 31), not {text!r}")
    return text.lower()


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def add_parsers(commands) -> None:
    def common(p) -> None:
        p.add_argument("--help", action="help", help="show this help and exit")
        p.add_argument("--hosts", metavar="H1,H2", help="the nodes' MQTT addresses (default: from the group file)")
        p.add_argument("-h", "--host", action="append", metavar="HOST",
                       help="a node's address, as mosquitto's -h (repeatable; added to --hosts)")
        p.add_argument("-p", "--port", type=int, metavar="PORT",
                       help="the port of hosts given without one (default 1883, 8883 with TLS)")
        p.add_argument("-i", "--id", help="the client id (default: a random one)")
        p.add_argument("-u", "--username")
        p.add_argument("-P", "--pw", "--password", dest="password")
        p.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=1, help="QoS (default 1)")
        p.add_argument("-k", "--keepalive", type=int, default=10, metavar="SECONDS", help="keep-alive (default 10)")
        p.add_argument("-V", "--protocol-version", type=_version, default="mqttv5", metavar="VERSION",
                       help="mqttv5 (default), mqttv311 or mqttv31")
        p.add_argument("--cafile", metavar="FILE", help="verify the server against this CA (TLS, port 8883)")
        p.add_argument("--capath", metavar="DIR", help="verify the server against the CAs in this directory")
        p.add_argument("--cert", metavar="FILE", help="a client certificate (with --key)")
        p.add_argument("--key", metavar="FILE", help="the client certificate's private key")
        p.add_argument("--insecure", action="store_true", help="do not check the server's host name")
        p.add_argument("-d", "--debug", action="store_true", help="print each connection attempt on stderr")
        p.add_argument("--timeout", type=_positive, default=10.0,
                       help="seconds to connect / be acknowledged (default 10)")
        add_group(p)

    p = commands.add_parser("pub", help="publish like mosquitto_pub, across failovers", add_help=False,
                            description="Publish to whichever node is active; returns once acknowledged.",
                            epilog=examples("pairmq pub --hosts 10.0.0.1,10.0.0.2 -t cars/7/door -m unlock",
                                            "pairmq pub -h 10.0.0.1 -h 10.0.0.2 --cafile ca.pem -t a -f data.bin",
                                            "seq 100 | pairmq pub -t counts -l -q 2",
                                            "pairmq pub -t cars/7/door -r -n      # clear a retained message"))
    p.add_argument("-t", "--topic", required=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-m", "--message", help="the payload")
    what.add_argument("-f", "--file", type=Path, help="send the whole file as one message")
    what.add_argument("-n", "--null-message", action="store_true", help="send an empty message")
    what.add_argument("-s", "--stdin-file", action="store_true", help="send all of stdin as one message")
    what.add_argument("-l", "--lines", action="store_true", help="one message per line of stdin")
    p.add_argument("-r", "--retain", action="store_true", help="retain the message")
    common(p)
    p.set_defaults(handler=pub)

    s = commands.add_parser("sub", help="subscribe like mosquitto_sub, across failovers", add_help=False,
                            description="Print messages from whichever node is active.",
                            epilog=examples("pairmq sub --hosts 10.0.0.1,10.0.0.2 -t 'cars/#' -v",
                                            "pairmq sub -t alerts -C 1 -W 30",
                                            "pairmq sub -t 'cars/#' -F '%I %t q%q r%r %l bytes: %p' -R"))
    s.add_argument("-t", "--topic", required=True, action="append", help="a topic filter (repeatable)")
    s.add_argument("-v", "--verbose", action="store_true", help='print "topic payload"')
    s.add_argument("-F", "--format", metavar="FORMAT",
                   help="print each message as FORMAT: %%t topic, %%p payload, %%q QoS, %%r retained, "
                        "%%l length, %%m message id, %%I ISO time, %%U Unix time, %%%%, \\n")
    s.add_argument("-N", "--no-eol", action="store_true", help="no newline after each message (as mosquitto_sub)")
    s.add_argument("-R", "--no-retained", action="store_true", help="skip retained messages (stale ones)")
    s.add_argument("-C", "--count", type=int, help="stop after this many messages")
    s.add_argument("-W", "--wait", type=_positive, metavar="SECONDS",
                   help="stop after this many seconds (as mosquitto_sub)")
    s.add_argument("-c", "--persistent", action="store_true", help="keep the session (queue while away); use -i")
    common(s)
    s.set_defaults(handler=sub)
