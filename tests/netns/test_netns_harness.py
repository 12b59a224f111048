"""The namespace harness itself: every fault must really cut, silently.

Each check is a real datagram or connection between real processes in the
hosts' namespaces, with a control case that shows the check would notice.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest
from pyroute2 import netns

from tests.harness.netns import ADDRESSES, HOSTS, FaultUnsupported, Hosts, cleanup_stale, hosts  # noqa: F401

ECHO_PORT = 7000
SINK_PORT = 7001
TCP_PORT = 7002
CLOSED_PORT = 7003  # nobody listens here

# Exit codes of the probe snippets.
GOT_REPLY, TIMED_OUT, SOCKET_ERROR = 0, 3, 4

ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(data, peer)
"""

# Connected UDP socket: an ICMP error would surface as an OSError (exit 4).
UDP_PROBE = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.05)
deadline = time.monotonic() + float(sys.argv[3])
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    while time.monotonic() < deadline:
        s.send(b"ping")
        try:
            if s.recv(2048) == b"ping":
                sys.exit(0)
        except socket.timeout:
            pass
except OSError as exc:
    print(repr(exc))
    sys.exit(4)
sys.exit(3)
"""

# Counts datagrams until its stdin closes, then prints the count.
SINK = """
import select, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
count = 0
while True:
    readable = select.select([s, sys.stdin], [], [])[0]
    if s in readable:
        s.recv(2048)
        count += 1
    elif sys.stdin.read(1) == "":
        break
print(count, flush=True)
"""

SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[3])):
    s.sendto(b"x", (sys.argv[1], int(sys.argv[2])))
    time.sleep(float(sys.argv[4]))
"""

TCP_LISTEN = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    s.accept()[0].close()
"""

TCP_CONNECT = """
import socket, sys, time
start = time.monotonic()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except TimeoutError:
    print("timeout %.2f" % (time.monotonic() - start))
except OSError as exc:
    print("error %s" % exc.errno)
"""

OUTSIDE = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b"x", ("192.0.2.1", 9))
    print("sent")
except OSError as exc:
    print(exc.errno)
"""


def _py(hosts: Hosts, host: str, code: str, *args: object, **kwargs) -> subprocess.Popen:
    return hosts.popen(host, [sys.executable, "-c", code, *map(str, args)], **kwargs)


def _start_ready(hosts: Hosts, host: str, code: str, *args: object, **kwargs) -> subprocess.Popen:
    proc = _py(hosts, host, code, *args, stdout=subprocess.PIPE, text=True, **kwargs)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _start_sink(hosts: Hosts, host: str) -> subprocess.Popen:
    return _start_ready(hosts, host, SINK, ADDRESSES[host], SINK_PORT, stdin=subprocess.PIPE)


def _sink_count(sink: subprocess.Popen) -> int:
    time.sleep(0.2)  # let datagrams in flight land
    return int(sink.communicate(input="", timeout=10)[0])


@pytest.fixture
def echo(hosts: Hosts) -> Hosts:
    for host in HOSTS:
        _start_ready(hosts, host, ECHO, ADDRESSES[host], ECHO_PORT)
    return hosts


def probe(hosts: Hosts, pairs, port: int = ECHO_PORT, timeout_s: float = 0.6) -> dict:
    """Round-trip UDP from src to dst for every pair at once -> exit code per pair."""
    procs = {
        (src, dst): _py(hosts, src, UDP_PROBE, ADDRESSES[dst], port, timeout_s, stdout=subprocess.DEVNULL)
        for src, dst in pairs
    }
    return {pair: proc.wait(timeout=10) for pair, proc in procs.items()}


ALL_PAIRS = [(a, b) for a in HOSTS for b in HOSTS if a != b]


def test_hosts_see_only_their_own_network(hosts):
    for host in HOSTS:
        links = hosts.run(host, ["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
        assert [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()] == ["lo", "eth0"]
        addrs = hosts.run(host, ["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
        assert f"inet {ADDRESSES[host]}/24" in addrs
        assert hosts.address(host) == ADDRESSES[host]


def test_everyone_reaches_everyone_at_start(echo):
    assert probe(echo, ALL_PAIRS) == {pair: GOT_REPLY for pair in ALL_PAIRS}


def test_cut_is_both_ways_and_silent(echo):
    echo.cut("primary", "backup")
    assert probe(echo, [("primary", "backup"), ("backup", "primary"), ("primary", "monitor")]) == {
        ("primary", "backup"): TIMED_OUT,
        ("backup", "primary"): TIMED_OUT,
        ("primary", "monitor"): GOT_REPLY,
    }


def test_udp_to_a_closed_port_errors_when_linked_and_is_silent_when_cut(hosts):
    # Control: with the link up the kernel's port-unreachable reaches the sender.
    assert probe(hosts, [("primary", "backup")], port=CLOSED_PORT) == {("primary", "backup"): SOCKET_ERROR}
    hosts.cut("primary", "backup")
    assert probe(hosts, [("primary", "backup")], port=CLOSED_PORT) == {("primary", "backup"): TIMED_OUT}


def test_cut_one_way_drops_only_that_direction(hosts):
    sinks = {host: _start_sink(hosts, host) for host in ("primary", "backup")}
    hosts.cut_one_way("primary", "backup")
    senders = [
        _py(hosts, "primary", SENDER, ADDRESSES["backup"], SINK_PORT, 10, 0.02),
        _py(hosts, "backup", SENDER, ADDRESSES["primary"], SINK_PORT, 10, 0.02),
    ]
    assert [s.wait(timeout=10) for s in senders] == [0, 0]  # no send() errors either way
    counts = {host: _sink_count(proc) for host, proc in sinks.items()}
    assert counts == {"backup": 0, "primary": 10}
    assert hosts.cuts == {("primary", "backup")}


def test_isolate_cuts_one_host_from_everyone(echo):
    echo.isolate("monitor")
    results = probe(echo, ALL_PAIRS)
    assert {pair for pair, code in results.items() if code == GOT_REPLY} == {
        pair for pair in ALL_PAIRS if "monitor" not in pair
    }
    assert {code for pair, code in results.items() if "monitor" in pair} == {TIMED_OUT}


def test_heal_restores_everything_and_faults_are_idempotent(echo):
    echo.cut("primary", "backup")
    echo.cut("primary", "backup")
    echo.cut_one_way("backup", "primary")
    echo.isolate("client")
    echo.isolate("client")
    echo.netem("monitor", loss_pct=100)
    echo.heal("primary", "backup")
    echo.heal("primary", "backup")
    assert probe(echo, [("primary", "backup"), ("backup", "primary"), ("client", "primary")]) == {
        ("primary", "backup"): GOT_REPLY,
        ("backup", "primary"): GOT_REPLY,
        ("client", "primary"): TIMED_OUT,
    }
    echo.heal("client")
    assert echo.cuts == frozenset()
    echo.heal()
    echo.heal()
    assert probe(echo, ALL_PAIRS) == {pair: GOT_REPLY for pair in ALL_PAIRS}


def test_tcp_connect_across_a_cut_times_out_instead_of_failing(hosts):
    _start_ready(hosts, "backup", TCP_LISTEN, ADDRESSES["backup"], TCP_PORT)

    def connect(port: int) -> str:
        proc = _py(hosts, "primary", TCP_CONNECT, ADDRESSES["backup"], port, 1.0,
                   stdout=subprocess.PIPE, text=True)
        return proc.communicate(timeout=10)[0].strip()

    assert connect(TCP_PORT) == "connected"
    assert connect(CLOSED_PORT) == f"error {errno.ECONNREFUSED}"  # control: errors do come through
    hosts.cut("primary", "backup")
    for port in (TCP_PORT, CLOSED_PORT):
        outcome, elapsed = connect(port).split()
        assert outcome == "timeout" and float(elapsed) >= 0.9


def test_cut_tcp_port_drops_only_that_port_between_those_two(echo):
    """What the mate-link fault tests use: TCP to one port is gone, UDP and other TCP ports still pass."""
    hosts = echo
    _start_ready(hosts, "backup", TCP_LISTEN, ADDRESSES["backup"], TCP_PORT)

    def connect(src: str, port: int) -> str:
        proc = _py(hosts, src, TCP_CONNECT, ADDRESSES["backup"], port, 1.0, stdout=subprocess.PIPE, text=True)
        return proc.communicate(timeout=10)[0].strip().split()[0]

    hosts.cut_tcp_port("primary", "backup", TCP_PORT)
    hosts.cut_tcp_port("backup", "primary", TCP_PORT)  # the same cut: idempotent
    assert connect("primary", TCP_PORT) == "timeout"
    assert connect("monitor", TCP_PORT) == "connected"  # only that pair
    assert connect("primary", CLOSED_PORT) == "error"  # other TCP ports pass (refused, not dropped)
    assert probe(hosts, [("primary", "backup"), ("backup", "primary")]) == {("primary", "backup"): 0,
                                                                           ("backup", "primary"): 0}
    hosts.heal_tcp_port("backup", "primary", TCP_PORT)
    assert connect("primary", TCP_PORT) == "connected"


def test_nothing_leaves_the_subnet(hosts):
    for host in HOSTS:
        run = hosts.run(host, [sys.executable, "-c", OUTSIDE], capture_output=True, text=True, check=True)
        out = run.stdout
        assert out.strip() == str(errno.ENETUNREACH), host
        for family in ("-4", "-6"):
            routes = hosts.run(host, ["ip", family, "route", "show", "default"],
                               capture_output=True, text=True)
            assert routes.stdout.strip() == "", (host, routes.stdout)


def test_netem_loss_drops_that_share(hosts):
    def delivered(count: int) -> int:
        sink = _start_sink(hosts, "backup")
        sender = _py(hosts, "primary", SENDER, ADDRESSES["backup"], SINK_PORT, count, 0.001)
        assert sender.wait(timeout=10) == 0
        return _sink_count(sink)

    hosts.netem("primary", loss_pct=50)
    assert 100 <= delivered(400) <= 300  # binomial(400, 0.5): sd 10
    hosts.netem("primary", loss_pct=100)
    assert delivered(50) == 0
    hosts.netem("primary")
    assert delivered(200) == 200


def test_netem_delay_or_a_clear_refusal(echo):
    """Kernels without the netem qdisc (this CI machine's) refuse delay clearly and leave the link as it was."""
    try:
        echo.netem("primary", delay_ms=100)
    except FaultUnsupported as exc:
        assert "netem" in str(exc)
        assert probe(echo, [("primary", "backup")], timeout_s=2.0) == {("primary", "backup"): GOT_REPLY}
        qdiscs = echo.run("primary", ["tc", "qdisc", "show"], capture_output=True, text=True).stdout
        assert "netem" not in qdiscs and "tbf" not in qdiscs, f"a refused delay left a qdisc behind: {qdiscs}"
        return
    start = time.monotonic()
    assert probe(echo, [("primary", "backup")], timeout_s=2.0) == {("primary", "backup"): GOT_REPLY}
    assert time.monotonic() - start >= 0.1
    echo.netem("primary")


def _ours() -> set[str]:
    """Namespaces of this process (other runs may create theirs meanwhile)."""
    return {name for name in netns.listnetns() if name.startswith(f"pmq{os.getpid()}-")}


def test_teardown_leaves_no_namespace_even_after_a_failed_setup():
    assert _ours() == set()
    with Hosts() as h:
        names = {h.netns_name(host) for host in HOSTS}
        assert len(names) == 4 and names < _ours()
        h.popen("primary", ["sleep", "60"])  # a live process must not block teardown
    assert _ours() == set()

    broken = Hosts()
    squatter = broken.netns_name("client")
    netns.create(squatter)  # the fourth of five namespaces cannot be created
    try:
        with pytest.raises(FileExistsError):
            with broken:
                pass
        assert _ours() == {squatter}  # the four it made are gone, the squatter untouched
    finally:
        netns.remove(squatter)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert f"pmq{os.getpid()}-" not in listed, listed


def test_cleanup_stale_removes_only_dead_runs():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, alive = f"pmq{dead.pid}-0p", f"pmq{os.getpid()}-99p"
    netns.create(stale)
    netns.create(alive)
    try:
        assert stale in cleanup_stale()
        assert stale not in netns.listnetns() and alive in netns.listnetns()
    finally:
        for name in (stale, alive):
            if name in netns.listnetns():
                netns.remove(name)
