"""The optional virtual IP: the active holds it, and gives it up the moment it stops serving.

Rules:
1. Only the active holds the address. It is added when the node takes activity
   (an "activate" decision) and announced with `arp_count` gratuitous ARPs,
   `arp_interval_ms` apart, so clients and switches move to this host's MAC at
   once instead of when their ARP entries expire.
2. It is removed before anyone else may take it. On a step-down the removal
   runs on the heartbeat thread before the step-down's own heartbeat leaves
   (after a planned handover that heartbeat carries the yield that lets the
   mate take activity at once); on shutdown it is the first thing done.
3. A starting node removes the address from its interface before anything
   else: a node killed -9 while it held it left it there, and the kernel keeps
   answering ARP for it until someone deletes it. (The same removal runs as
   `python -m pairmq.appliance.node.vip release`, for systemd's ExecStopPost.)
4. A failure (no CAP_NET_ADMIN or CAP_NET_RAW, no such interface) is one
   sentence in the log, the event log and the redundancy view, logged once per
   new sentence; it never stops the broker, whose host-list clients do not need
   the VIP. While the node is active, adding is retried every RETRY_S, and
   every CHECK_S it checks that the address is still there: something else
   (an operator, a network manager) may have deleted it; then it is added and
   announced again.
5. netlink and the raw ARP socket are used from this module's own thread, or
   from the thread that asks for a removal, never from the broker's event loop.
   One change at a time (`_ops`); a removal that finds an add under way waits
   for it and then removes.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
import threading
from typing import Callable

from ..config import VipConfig

log = logging.getLogger("pairmq.vip")

RETRY_S = 2.0  # while active and the address could not be added
CHECK_S = 2.0  # while held: still on the interface?
STOP_JOIN_S = 2.0
BROADCAST = "ff:ff:ff:ff:ff:ff"

EventSink = Callable[[str, dict], None]


class VipError(Exception):
    """One sentence saying why the virtual IP could not be added, announced or removed."""


class VipHolder:
    def __init__(self, vip: VipConfig, interface: str, on_event: EventSink | None = None) -> None:
        self.vip = vip
        self.interface = interface
        self._on_event = on_event or (lambda kind, fields: None)
        self._cond = threading.Condition()
        self._want = False  # the node serves; guarded by _cond
        self._why = ""
        self._stopping = False
        self._ops = threading.Lock()
        self._thread: threading.Thread | None = None
        self.held = False
        self.error: str | None = None  # the latest failure, None once an attempt succeeds
        self.announcements = 0
        self.adds = 0
        self.removals = 0

    # --- what the node calls ----------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="pairmq-vip", daemon=True)
        self._thread.start()

    def hold(self, why: str) -> None:
        """The node took activity: add and announce, on our thread (returns at once)."""
        with self._cond:
            self._want = True
            self._why = why
            self._cond.notify_all()

    def release(self, why: str) -> bool:
        """The node stops serving: remove the address now, on the caller's thread. Never raises.
        Returns whether an address was removed."""
        with self._cond:
            self._want = False
            self._cond.notify_all()  # ends an announcement burst
        with self._ops:
            try:
                removed = _remove(self.vip, self.interface)
            except VipError as exc:
                self._fail("remove", str(exc))
                return False
            except Exception as exc:  # on the heartbeat thread: a pyroute2 surprise must not stop the node
                log.exception("removing the virtual IP failed")
                self._fail("remove", f"cannot remove virtual IP {self.vip.with_prefix} from {self.interface}: "
                                     f"{exc!r}")
                return False
            self.held = False
        if removed:
            self.removals += 1
            log.warning("virtual IP %s removed from %s: %s", self.vip.with_prefix, self.interface, why)
            self._on_event("vip_removed", {"address": self.vip.with_prefix, "interface": self.interface, "why": why})
        return removed

    def stop(self, why: str) -> None:
        self.release(why)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(STOP_JOIN_S)

    def view(self) -> dict:
        return {"address": self.vip.with_prefix, "interface": self.interface, "held": self.held,
                "error": self.error, "announcements": self.announcements, "adds": self.adds,
                "removals": self.removals}

    # --- our thread ----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            _warm_up()  # scapy's import is slow: not between taking activity and the first announcement
        except Exception as exc:  # the announcement says so again, in its own sentence
            log.error("cannot load scapy for gratuitous ARP: %r", exc)
        while True:
            try:
                if self._turn():
                    return
            except Exception as exc:  # a bug or a pyroute2/scapy surprise: say it, keep trying while active
                log.exception("the virtual IP thread failed")
                self._fail("add", f"cannot hold virtual IP {self.vip.with_prefix} on {self.interface}: {exc!r}")
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, timeout=RETRY_S)

    def _turn(self) -> bool:
        """One wait and what it calls for; True once stopping."""
        with self._cond:
            woken = self._cond.wait_for(lambda: self._stopping or (self._want and not self.held), timeout=CHECK_S)
            if self._stopping:
                return True
            why = self._why
        if not woken:
            self._check_still_held()
        elif self._add(why):
            self._announce()
        else:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or not self._want, timeout=RETRY_S)
        return False

    def _check_still_held(self) -> None:
        with self._ops:
            with self._cond:
                if not (self._want and self.held):
                    return
            try:
                if _holds(self.vip, self.interface):
                    return
            except VipError as exc:
                self._fail("check", str(exc))
                return
            self.held = False  # the loop adds and announces it again
            self._why = "it had disappeared from the interface (removed by something else)"
        log.error("virtual IP %s disappeared from %s while this node is active; adding it again",
                  self.vip.with_prefix, self.interface)
        self._on_event("vip_lost", {"address": self.vip.with_prefix, "interface": self.interface})

    def _add(self, why: str) -> bool:
        with self._ops:
            with self._cond:
                if not self._want:  # a release came first: it wins
                    return False
            try:
                _add(self.vip, self.interface)
            except VipError as exc:
                self._fail("add", str(exc))
                return False
            self.held = True
        self.adds += 1
        self.error = None
        log.warning("virtual IP %s added to %s: %s", self.vip.with_prefix, self.interface, why)
        self._on_event("vip_added", {"address": self.vip.with_prefix, "interface": self.interface, "why": why})
        return True

    def _announce(self) -> None:
        """`arp_count` gratuitous ARPs, stopped early by a release."""
        sent = 0
        try:
            with _ArpAnnouncer(self.vip.address, self.interface) as announcer:
                for i in range(self.vip.arp_count):
                    with self._cond:
                        if not self._want or self._stopping:
                            break
                    announcer.send()
                    sent += 1
                    self.announcements += 1
                    if i + 1 < self.vip.arp_count:
                        with self._cond:
                            self._cond.wait_for(lambda: not self._want or self._stopping,
                                                timeout=self.vip.arp_interval_ms / 1000)
        except VipError as exc:
            self._fail("announce", str(exc))
        if sent:
            self._on_event("vip_announced", {"address": self.vip.address, "interface": self.interface,
                                             "gratuitous_arps": sent})

    def _fail(self, action: str, sentence: str) -> None:
        if sentence != self.error:
            log.error("%s", sentence)
            self._on_event("vip_failed", {"action": action, "error": sentence})
        self.error = sentence


# --- netlink (pyroute2) and ARP (scapy) ------------------------------------------------------


def _warm_up() -> None:
    import pyroute2  # noqa: F401
    import scapy.layers.l2  # noqa: F401
    from scapy.config import conf

    conf.L2socket  # noqa: B018 (resolves the Linux socket class)


def _netlink_error(what: str, vip: VipConfig, interface: str, exc: Exception) -> VipError:
    code = getattr(exc, "code", None) or getattr(exc, "errno", None)
    if code in (errno.EPERM, errno.EACCES):
        return VipError(f"cannot {what} virtual IP {vip.with_prefix} on {interface}: operation not permitted "
                        f"(the node needs CAP_NET_ADMIN)")
    return VipError(f"cannot {what} virtual IP {vip.with_prefix} on {interface}: {exc}")


def _ifindex(ipr, interface: str, vip: VipConfig) -> int:
    found = ipr.link_lookup(ifname=interface)
    if not found:
        raise VipError(f"cannot hold virtual IP {vip.with_prefix}: interface {interface} does not exist on this host")
    return found[0]


def _present(ipr, index: int, vip: VipConfig) -> list[int]:
    """The prefix lengths the VIP has on the interface (a stale one may have an older prefix)."""
    return [msg["prefixlen"] for msg in ipr.get_addr(family=2)
            if msg["index"] == index and msg.get_attr("IFA_LOCAL") == vip.address]


def _holds(vip: VipConfig, interface: str) -> bool:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with IPRoute() as ipr:
            return vip.prefix_len in _present(ipr, _ifindex(ipr, interface, vip), vip)
    except (NetlinkError, OSError) as exc:
        raise _netlink_error("check", vip, interface, exc) from None


def _add(vip: VipConfig, interface: str) -> None:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with IPRoute() as ipr:
            index = _ifindex(ipr, interface, vip)
            if vip.prefix_len in _present(ipr, index, vip):
                return
            ipr.addr("add", index=index, address=vip.address, prefixlen=vip.prefix_len)
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise _netlink_error("add", vip, interface, exc) from None
    except OSError as exc:
        raise _netlink_error("add", vip, interface, exc) from None


def _remove(vip: VipConfig, interface: str) -> bool:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    removed = False
    try:
        with IPRoute() as ipr:
            index = _ifindex(ipr, interface, vip)
            for prefix_len in _present(ipr, index, vip):
                try:
                    ipr.addr("del", index=index, address=vip.address, prefixlen=prefix_len)
                    removed = True
                except NetlinkError as exc:
                    if exc.code != errno.EADDRNOTAVAIL:  # gone meanwhile: that is what we want
                        raise
    except NetlinkError as exc:
        raise _netlink_error("remove", vip, interface, exc) from None
    except OSError as exc:
        raise _netlink_error("remove", vip, interface, exc) from None
    except VipError:
        return False  # no such interface: nothing of ours can be on it
    return removed


class _ArpAnnouncer:
    """Gratuitous ARP: an ARP request for the VIP from the VIP (RFC 5227's announcement), sent from the
    interface's MAC to broadcast: a host with a neighbour entry for the VIP updates it to our MAC. One socket
    for the whole burst."""

    def __init__(self, address: str, interface: str) -> None:
        self.address, self.interface = address, interface
        self._socket = None
        self._frame = None

    def __enter__(self) -> _ArpAnnouncer:
        from scapy.config import conf
        from scapy.layers.l2 import ARP, Ether

        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            links = ipr.link("get", ifname=self.interface)
            mac = links[0].get_attr("IFLA_ADDRESS")
        self._frame = (Ether(src=mac, dst=BROADCAST)
                       / ARP(op=1, hwsrc=mac, psrc=self.address, hwdst="00:00:00:00:00:00", pdst=self.address))
        try:
            self._socket = conf.L2socket(iface=self.interface)
        except PermissionError:
            raise VipError(f"cannot announce virtual IP {self.address} on {self.interface}: no raw socket "
                           f"(the node needs CAP_NET_RAW)") from None
        except OSError as exc:
            raise VipError(f"cannot announce virtual IP {self.address} on {self.interface}: {exc}") from None
        return self

    def send(self) -> None:
        try:
            self._socket.send(self._frame)
        except OSError as exc:
            raise VipError(f"cannot announce virtual IP {self.address} on {self.interface}: {exc}") from None

    def __exit__(self, *exc) -> None:
        if self._socket is not None:
            self._socket.close()


# --- `python -m pairmq.appliance.node.vip release`: systemd's ExecStopPost --------------------------------


def main(argv: list[str] | None = None) -> int:
    """Remove a node's virtual IP from its interface after the node stopped, however it stopped."""
    parser = argparse.ArgumentParser(prog="python -m pairmq.appliance.node.vip", description=main.__doc__)
    parser.add_argument("action", choices=["release"])
    parser.add_argument("--group", default=None, help="the group file (default: $PAIRMQ_GROUP or /etc/pairmq/group.toml)")
    parser.add_argument("--role", required=True, choices=["primary", "backup"])
    args = parser.parse_args(argv)
    import os

    from ..config import DEFAULT_GROUP_PATH, load_group
    from ..errors import ConfigError
    from ..roles import Role

    try:
        config = load_group(args.group or os.environ.get("PAIRMQ_GROUP") or DEFAULT_GROUP_PATH)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.vip is None:
        print("the group file has no [vip] table: nothing to release")
        return 0
    role = Role(args.role)
    log.setLevel(logging.CRITICAL)  # the one line below says it all
    holder = VipHolder(config.vip, config.vip.interfaces[role])
    removed = holder.release("released after the node stopped")
    if holder.error:
        print(f"error: {holder.error}", file=sys.stderr)
        return 1
    print(f"virtual IP {config.vip.with_prefix} {'removed from' if removed else 'was not on'} {holder.interface}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
