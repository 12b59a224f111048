"""`pairmq pub` and `pairmq sub`: mosquitto_pub/sub with a host list, on the host-list client.

Rules:
- `--hosts H1[:P],H2[:P]` names the nodes; without it, the group file's primary and backup MQTT
  addresses. Either command rides through a failover (cli/hostlist.py).
- `pub` sends `-m MESSAGE` (or each line of stdin with `-l`) and returns once every message was
  acknowledged (QoS 1/2), or fails with one sentence after `--timeout` seconds.
- `sub` prints each payload (with `-v`: "topic payload") on its own line, and stops after `-C COUNT`
  messages or `-W SECONDS` without one, or at Ctrl-C. A persistent session (`-c`, with `-i ID`) keeps
  messages queued while it is away.
- Payloads are printed as UTF-8 text, with undecodable bytes replaced.
"""

from __future__ import annotations

import queue
import secrets
import sys
import time
from typing import TYPE_CHECKING

from pairmq.appliance.errors import PairMQError

from .options import add_group, examples, group_path
from .terminal import Terminal

# cli/hostlist.py (paho-mqtt) is imported where a client is made: every command builds this module's parsers,
# and `pairmq node` (each node start) has no use for an MQTT client.
if TYPE_CHECKING:
    from .hostlist import HostListClient


def _hosts(args) -> list[str]:
    if args.hosts:
        return args.hosts.split(",")
    from pairmq.appliance.config import load_group
    from pairmq.appliance.roles import Role
    config = load_group(group_path(args))
    return [config.mqtt_reference(Role.PRIMARY), config.mqtt_reference(Role.BACKUP)]


def _client(args, prefix: str, **kwargs) -> HostListClient:
    from .hostlist import ClientError, HostListClient

    client_id = args.id or f"{prefix}-{secrets.token_hex(4)}"
    try:
        client = HostListClient(_hosts(args), client_id, username=args.username, password=args.password, **kwargs)
        client.start(timeout_s=args.timeout)
    except ClientError as exc:
        raise PairMQError(str(exc)) from None
    return client


def pub(args, term: Terminal) -> int:
    payloads = [line.rstrip("\n").encode() for line in sys.stdin] if args.lines else [args.message.encode()]
    client = _client(args, "pairmq-pub", session_expiry_s=60)
    try:
        handles = [client.publish(args.topic, p, qos=args.qos, retain=args.retain) for p in payloads]
        deadline = time.monotonic() + args.timeout
        late = [h for h in handles if not h.wait(max(0.0, deadline - time.monotonic()))]
        if late:
            raise PairMQError(f"{len(late)} of {len(handles)} messages were not acknowledged within "
                              f"{args.timeout:g} s")
    finally:
        client.stop()
    if client.failovers:
        term.note(f"sent {len(payloads)} message(s) across {client.failovers} failover(s)")
    return 0


def sub(args, term: Terminal) -> int:
    got: queue.Queue = queue.Queue()
    expiry = 3600 if args.persistent else 0
    client = _client(args, "pairmq-sub", session_expiry_s=expiry, message_ids=False)
    try:
        for topic_filter in args.topic:
            client.subscribe(topic_filter, args.qos, lambda topic, payload: got.put((topic, payload)))
        count = 0
        while args.count is None or count < args.count:
            try:
                topic, payload = got.get(timeout=args.wait if args.wait else None)
            except queue.Empty:
                break
            text = payload.decode("utf-8", "replace")
            term.out.file.write(f"{topic} {text}\n" if args.verbose else f"{text}\n")
            term.out.file.flush()
            count += 1
    except KeyboardInterrupt:
        pass
    finally:
        client.stop()
    return 0


def add_parsers(commands) -> None:
    def common(p) -> None:
        p.add_argument("--hosts", metavar="H1,H2", help="the nodes' MQTT addresses (default: from the group file)")
        p.add_argument("-i", "--id", help="the client id (default: a random one)")
        p.add_argument("-u", "--username")
        p.add_argument("-P", "--password")
        p.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=1, help="QoS (default 1)")
        p.add_argument("--timeout", type=float, default=10.0, help="seconds to connect / be acknowledged (10)")
        add_group(p)

    p = commands.add_parser("pub", help="publish like mosquitto_pub, across failovers",
                            description="Publish to whichever node is active; returns once acknowledged.",
                            epilog=examples("pairmq pub --hosts 10.0.0.1,10.0.0.2 -t cars/7/door -m unlock",
                                            "seq 100 | pairmq pub -t counts -l -q 2"))
    p.add_argument("-t", "--topic", required=True)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("-m", "--message", help="the payload")
    what.add_argument("-l", "--lines", action="store_true", help="one message per line of stdin")
    p.add_argument("-r", "--retain", action="store_true")
    common(p)
    p.set_defaults(handler=pub)

    s = commands.add_parser("sub", help="subscribe like mosquitto_sub, across failovers",
                            description="Print messages from whichever node is active.",
                            epilog=examples("pairmq sub --hosts 10.0.0.1,10.0.0.2 -t 'cars/#' -v",
                                            "pairmq sub -t alerts -C 1 -W 30"))
    s.add_argument("-t", "--topic", required=True, action="append", help="a topic filter (repeatable)")
    s.add_argument("-v", "--verbose", action="store_true", help='print "topic payload"')
    s.add_argument("-C", "--count", type=int, help="stop after this many messages")
    s.add_argument("-W", "--wait", type=float, help="stop after this many seconds without a message")
    s.add_argument("-c", "--persistent", action="store_true", help="keep the session (queue while away); use -i")
    common(s)
    s.set_defaults(handler=sub)
