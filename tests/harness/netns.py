"""One network namespace per PairMQ host, so integration tests can cut links.

Rules of this harness:

1. Four hosts -- primary 10.77.0.1, backup 10.77.0.2, monitor 10.77.0.3,
   client 10.77.0.10 on 10.77.0.0/24 -- each in its own namespace, each with
   one veth into a Linux bridge that lives in a fifth "switch" namespace.
2. No namespace has a default route: a packet for anything outside the /24
   fails with "network unreachable" in the sender. Traffic never leaves the
   namespaces this harness created.
3. Faults live in the switch, like a pulled cable: nftables rules in the
   bridge family's forward hook, matched on the (ingress port, egress port)
   pair. A dropped frame has already left the sender's veth, so the sender
   sees nothing -- no ICMP, no send() error; a TCP connect just times out.
   ARP is never dropped (by cuts or by loss): a one-way cut stays one-way
   (each side can still resolve the other's MAC for the direction that
   works), a cut never turns into a local "no route to host" error after
   neighbour resolution fails, and loss means lost IP packets rather than
   one-second ARP retry stalls.
4. Every fault is state, not a command: cutting an already cut link, or
   healing a healthy one, changes nothing. Each directed cut is its own base
   chain, so a heal is one atomic chain delete and never briefly re-opens an
   unrelated cut.
5. Teardown removes what this instance created even when set-up failed half
   way. `cleanup_stale()` removes namespaces left by crashed runs.

Theory of operation: every pyroute2 call runs on one private worker thread.
pyroute2 0.9's synchronous API drives its own asyncio loop, which fails inside
a running loop (async tests), and entering the switch namespace to open the
nftables socket calls setns(), which must not touch the test's own thread.

Use in a test module::

    from tests.harness.netns import hosts  # noqa: F401  (the pytest fixture)

    def test_partition(hosts):
        hosts.cut("primary", "backup")

Processes started with `popen` run under `ip netns exec`, so they see only
their host's interfaces and routes.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import struct
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.nftables.main import NFTables

HOSTS = ("primary", "backup", "monitor", "client")
ADDRESSES = {
    "primary": "10.77.0.1",
    "backup": "10.77.0.2",
    "monitor": "10.77.0.3",
    "client": "10.77.0.10",
}
PREFIX_LEN = 24
NAME_PREFIX = "pmq"
_NAME_RE = re.compile(rf"^{NAME_PREFIX}(\d+)-\d+[a-z]$")
_LETTER = {"primary": "p", "backup": "b", "monitor": "m", "client": "c"}
_HOST_IFNAME = "eth0"
_BRIDGE = "br0"
_TABLE = "pmq"

_NETLINK_TIMEOUT_S = 10.0
_TERMINATE_GRACE_S = 2.0

# Kernel constants (linux/netfilter*.h, linux/if_ether.h).
_NFPROTO_BRIDGE = 7
_NF_BR_FORWARD = 2
_NF_ACCEPT = 1
_NF_DROP = 0
_NFT_META_PROTOCOL = 1
_NFT_META_IIF = 4
_NFT_META_OIF = 5
_NFT_CMP_EQ = 0
_NFT_CMP_NEQ = 1
_NFT_CMP_LT = 2
_NFT_NG_RANDOM = 1
_NFT_BYTEORDER_HTON = 1
_ETH_P_ARP = 0x0806
_ETH_P_IP = 0x0800
_NFT_META_L4PROTO = 16
_NFT_PAYLOAD_TRANSPORT_HEADER = 2
_IPPROTO_TCP = 6
_REG_VERDICT = 0
_REG_1 = 1

_instances = 0


class FaultUnsupported(RuntimeError):
    """The running kernel lacks what a fault needs (e.g. sch_netem)."""


def _expr(name: str, prefix: str, **data: Any) -> list[dict]:
    attrs = [(f"NFTA_{prefix}_{key.upper()}", value) for key, value in data.items()]
    return [{"attrs": [("NFTA_EXPR_NAME", name), ("NFTA_EXPR_DATA", {"attrs": attrs})]}]


def _value(raw: bytes) -> dict:
    return {"attrs": [("NFTA_DATA_VALUE", raw)]}


def _meta_is(key: int, raw: bytes, op: int = _NFT_CMP_EQ) -> list[list[dict]]:
    return [
        _expr("meta", "META", dreg=_REG_1, key=key),
        _expr("cmp", "CMP", sreg=_REG_1, op=op, data=_value(raw)),
    ]


def _not_arp() -> list[list[dict]]:
    return _meta_is(_NFT_META_PROTOCOL, struct.pack(">H", _ETH_P_ARP), op=_NFT_CMP_NEQ)


def _tcp_port_is(port: int, field_offset: int) -> list[list[dict]]:
    """An IPv4 TCP segment whose source (offset 0) or destination (offset 2) port is `port`."""
    return [
        *_meta_is(_NFT_META_PROTOCOL, struct.pack(">H", _ETH_P_IP)),
        *_meta_is(_NFT_META_L4PROTO, bytes([_IPPROTO_TCP])),
        _expr("payload", "PAYLOAD", dreg=_REG_1, base=_NFT_PAYLOAD_TRANSPORT_HEADER, offset=field_offset, len=2),
        _expr("cmp", "CMP", sreg=_REG_1, op=_NFT_CMP_EQ, data=_value(struct.pack(">H", port))),
    ]


def _drop() -> list[dict]:
    verdict = {"attrs": [("NFTA_DATA_VERDICT", {"attrs": [("NFTA_VERDICT_CODE", _NF_DROP)]})]}
    return _expr("immediate", "IMMEDIATE", dreg=_REG_VERDICT, data=verdict)


def _random_below(percent: int) -> list[list[dict]]:
    # numgen leaves a host-order u32; cmp LT is a memcmp, so swap to big endian first.
    return [
        _expr("numgen", "NG", dreg=_REG_1, modulus=100, type=_NFT_NG_RANDOM, offset=0),
        _expr("byteorder", "BYTEORDER", sreg=_REG_1, dreg=_REG_1, op=_NFT_BYTEORDER_HTON, len=4, size=4),
        _expr("cmp", "CMP", sreg=_REG_1, op=_NFT_CMP_LT, data=_value(struct.pack(">I", percent))),
    ]


def _ifindex(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    assert len(found) == 1, f"{ifname}: {found}"
    return found[0]


def cleanup_stale() -> list[str]:
    """Remove namespaces named by this harness whose creating process is gone.

    Only the names are removed; a process a crashed run left inside keeps its
    (now anonymous) namespace alive but can no longer collide with anything.
    """
    removed = []
    for name in netns.listnetns():
        match = _NAME_RE.match(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        try:
            netns.remove(name)
            removed.append(name)
        except OSError:
            pass  # a concurrent cleaner won the race
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Hosts:
    """Four hosts on one bridge, with reversible, idempotent link faults."""

    def __init__(self) -> None:
        global _instances
        self._tag = f"{NAME_PREFIX}{os.getpid()}-{_instances}"
        _instances += 1
        self._ns = {host: f"{self._tag}{_LETTER[host]}" for host in HOSTS}
        self._switch = f"{self._tag}s"
        self._created: list[str] = []
        self._ports: dict[str, int] = {}  # host -> switch-side veth ifindex
        self._cuts: set[tuple[str, str]] = set()  # directed (src, dst)
        self._port_cuts: set[tuple[str, str, int]] = set()  # (a, b, TCP port), a < b
        self._loss_pct: dict[str, int] = {}
        self._delayed: set[str] = set()
        self._procs: list[tuple[subprocess.Popen, bool]] = []
        self._nft: NFTables | None = None
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pmq-netns")

    # -- life cycle ---------------------------------------------------------

    def __enter__(self) -> Hosts:
        try:
            self._call(self._setup)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop our processes, then remove every namespace we created."""
        errors: list[str] = []
        for proc, own_group in self._procs:
            try:
                _stop(proc, own_group)
            except Exception as exc:  # keep tearing down
                errors.append(f"pid {proc.pid}: {exc!r}")
        self._procs.clear()
        try:
            self._call(self._close_netlink)
        except Exception as exc:  # keep tearing down
            errors.append(f"nftables socket: {exc!r}")
        existing = set(netns.listnetns())
        for name in reversed(self._created):
            if name in existing:
                try:
                    netns.remove(name)
                except OSError as exc:
                    errors.append(f"{name}: {exc!r}")
        self._created.clear()
        self._worker.shutdown(wait=True)
        if errors:
            raise RuntimeError("netns teardown incomplete: " + "; ".join(errors))

    def _call(self, fn, *args):
        return self._worker.submit(fn, *args).result(timeout=_NETLINK_TIMEOUT_S)

    def _setup(self) -> None:
        for name in (self._switch, *self._ns.values()):
            netns.create(name)
            self._created.append(name)  # only now is it ours to remove
        with IPRoute(netns=self._switch, flags=0) as ipr:
            _set_up(ipr, "lo")
            ipr.link("add", ifname=_BRIDGE, kind="bridge", br_forward_delay=0, br_stp_state=0)
            bridge = _ifindex(ipr, _BRIDGE)
            for host, name in self._ns.items():
                port = f"s-{host}"
                ipr.link("add", ifname=port, kind="veth", peer={"ifname": _HOST_IFNAME, "net_ns_fd": name})
                self._ports[host] = _ifindex(ipr, port)
                ipr.link("set", index=self._ports[host], master=bridge, state="up")
            ipr.link("set", index=bridge, state="up")
        for host, name in self._ns.items():
            with IPRoute(netns=name, flags=0) as ipr:
                _set_up(ipr, "lo")
                eth = _ifindex(ipr, _HOST_IFNAME)
                ipr.addr("add", index=eth, address=ADDRESSES[host], prefixlen=PREFIX_LEN)
                ipr.link("set", index=eth, state="up")
                defaults = [r for r in ipr.route("dump") if r.get("dst_len") == 0]
                assert not defaults, f"{host} has a default route: {defaults}"
        # The nftables socket binds to the namespace current at creation.
        netns.pushns(self._switch)
        try:
            self._nft = NFTables(nfgen_family=_NFPROTO_BRIDGE)
        finally:
            netns.popns()
        self._nft.table("add", name=_TABLE)

    def _close_netlink(self) -> None:
        if self._nft is not None:
            self._nft.close()
            self._nft = None

    # -- hosts and processes ------------------------------------------------

    def address(self, host: str) -> str:
        return ADDRESSES[_check(host)]

    def netns_name(self, host: str) -> str:
        return self._ns[_check(host)]

    def exec_prefix(self, host: str) -> list[str]:
        """argv prefix that runs a command inside `host` (for other launchers)."""
        return ["ip", "netns", "exec", self.netns_name(host)]

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside `host`; it is stopped at teardown if still running.

        By default the child gets its own session so teardown can stop its
        whole process group.
        """
        own_group = kwargs.setdefault("start_new_session", True) is True
        proc = subprocess.Popen([*self.exec_prefix(host), *argv], **kwargs)
        self._procs.append((proc, own_group))
        return proc

    def run(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run([*self.exec_prefix(host), *argv], **kwargs)

    # -- faults -------------------------------------------------------------

    @property
    def cuts(self) -> frozenset[tuple[str, str]]:
        """Directed (src, dst) pairs whose packets are currently dropped."""
        return frozenset(self._cuts)

    def cut(self, a: str, b: str) -> None:
        self.cut_one_way(a, b)
        self.cut_one_way(b, a)

    def cut_one_way(self, src: str, dst: str) -> None:
        """Silently drop every non-ARP frame from `src` to `dst`; `dst`->`src` still flows."""
        _check_pair(src, dst)
        if (src, dst) in self._cuts:
            return
        self._call(self._add_chain, f"cut-{src}-{dst}", [
            *_meta_is(_NFT_META_IIF, struct.pack("=I", self._ports[src])),
            *_meta_is(_NFT_META_OIF, struct.pack("=I", self._ports[dst])),
            *_not_arp(),
            _drop(),
        ])
        self._cuts.add((src, dst))

    def cut_tcp_port(self, a: str, b: str, port: int) -> None:
        """Silently drop TCP between `a` and `b`, both ways, to or from `port` (e.g. the mate link's 8301
        while heartbeats on UDP 8300 keep flowing). Everything else between them still passes."""
        _check_pair(a, b)
        if not 0 < port < 65536:
            raise ValueError(f"port {port} not in 1..65535")
        key = (*sorted((a, b)), port)
        if key in self._port_cuts:
            return
        for src, dst in ((a, b), (b, a)):
            link = [*_meta_is(_NFT_META_IIF, struct.pack("=I", self._ports[src])),
                    *_meta_is(_NFT_META_OIF, struct.pack("=I", self._ports[dst]))]
            self._call(self._add_chain, f"tcp{port}-{src}-{dst}", [*link, *_tcp_port_is(port, 2), _drop()],
                       [*link, *_tcp_port_is(port, 0), _drop()])
        self._port_cuts.add(key)

    def heal_tcp_port(self, a: str, b: str, port: int) -> None:
        key = (*sorted((_check(a), _check(b))), port)
        if key not in self._port_cuts:
            return
        for src, dst in ((a, b), (b, a)):
            self._call(self._del_chain, f"tcp{port}-{src}-{dst}")
        self._port_cuts.discard(key)

    def isolate(self, host: str) -> None:
        for other in HOSTS:
            if other != _check(host):
                self.cut(host, other)

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        """heal(): everything, netem included; heal(a): every link of a; heal(a, b): that link."""
        if b is not None and a is None:
            raise ValueError("heal(b=...) needs a")
        if a is not None:
            _check(a)
        if b is not None:
            _check_pair(a, b)
        for src, dst in sorted(self._cuts):
            if a is None or (b is None and a in (src, dst)) or {src, dst} == {a, b}:
                self._call(self._del_chain, f"cut-{src}-{dst}")
                self._cuts.discard((src, dst))
        if a is None:
            for host in HOSTS:
                self.netem(host)
            for x, y, port in sorted(self._port_cuts):
                self.heal_tcp_port(x, y, port)

    def netem(self, host: str, loss_pct: int = 0, delay_ms: int = 0, jitter_ms: int = 0) -> None:
        """Degrade `host`'s egress; all zeros restores it.

        Loss is random per IP packet (ARP is spared, see rule 3), applied in
        the switch with nftables numgen.
        Delay and jitter need the kernel's netem qdisc on the host's veth;
        without it they raise FaultUnsupported.
        """
        _check(host)
        if not 0 <= loss_pct <= 100:
            raise ValueError(f"loss_pct {loss_pct} not in 0..100")
        if delay_ms < 0 or jitter_ms < 0 or (jitter_ms and not delay_ms):
            raise ValueError("delay_ms, jitter_ms must be >= 0, and jitter needs delay")
        if self._loss_pct.get(host, 0) != loss_pct:
            chain = f"loss-{host}"
            if self._loss_pct.pop(host, 0):
                self._call(self._del_chain, chain)
            if loss_pct:
                self._call(self._add_chain, chain, [
                    *_meta_is(_NFT_META_IIF, struct.pack("=I", self._ports[host])),
                    *_not_arp(),
                    *_random_below(loss_pct),
                    _drop(),
                ])
                self._loss_pct[host] = loss_pct
        if delay_ms or host in self._delayed:
            self._call(self._set_delay, host, delay_ms, jitter_ms)

    # -- worker-thread netlink operations -----------------------------------

    def _add_chain(self, chain: str, *rules: list[list[dict]]) -> None:
        assert self._nft is not None
        self._nft.chain(
            "add", table=_TABLE, name=chain, hook="forward", type="filter", policy=_NF_ACCEPT,
        )
        for expressions in rules:
            self._nft.rule("add", table=_TABLE, chain=chain, expressions=expressions)

    def _del_chain(self, chain: str) -> None:
        assert self._nft is not None
        self._nft.chain("del", table=_TABLE, name=chain)  # takes its rules with it

    def _set_delay(self, host: str, delay_ms: int, jitter_ms: int) -> None:
        with IPRoute(netns=self._ns[host], flags=0) as ipr:
            eth = _ifindex(ipr, _HOST_IFNAME)
            if host in self._delayed:
                ipr.tc("del", index=eth, handle="1:", root=True)
                self._delayed.discard(host)
            if not delay_ms:
                return
            try:
                ipr.tc("add", "netem", index=eth, handle="1:", root=True,
                       delay=delay_ms * 1000, jitter=jitter_ms * 1000)
            except NetlinkError as exc:
                raise FaultUnsupported(
                    f"netem delay on {host}: kernel refused the netem qdisc ({exc}); "
                    "CONFIG_NET_SCH_NETEM is probably off",
                ) from exc
            self._delayed.add(host)


def _check(host: str) -> str:
    if host not in ADDRESSES:
        raise ValueError(f"unknown host {host!r}; hosts are {', '.join(HOSTS)}")
    return host


def _check_pair(a: str, b: str) -> None:
    if _check(a) == _check(b):
        raise ValueError(f"a link needs two hosts, got {a!r} twice")


def _set_up(ipr: IPRoute, ifname: str) -> None:
    ipr.link("set", index=_ifindex(ipr, ifname), state="up")


def _stop(proc: subprocess.Popen, own_group: bool) -> None:
    if proc.poll() is not None:
        return
    send = (lambda sig: os.killpg(proc.pid, sig)) if own_group else proc.send_signal
    try:
        send(signal.SIGTERM)
        send(signal.SIGCONT)  # a test may have left it SIGSTOPped
        proc.wait(timeout=_TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(timeout=_TERMINATE_GRACE_S)
    except ProcessLookupError:
        proc.wait(timeout=_TERMINATE_GRACE_S)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    """A fresh four-host network; every fault and process is gone afterwards."""
    if os.geteuid() != 0:
        pytest.fail("network namespace tests need root (run the suite as root, or deselect them with -m 'not netns')")
    cleanup_stale()
    with Hosts() as h:
        yield h
