"""systemd's notify protocol in a few lines: READY=1, WATCHDOG=1, STATUS=..., STOPPING=1."""

import os
import socket


def notify(message: str) -> bool:
    """Send `message` to systemd if we run under Type=notify; a no-op otherwise."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False
    return True


def watchdog_interval_s() -> float | None:
    """How often to send WATCHDOG=1: half of systemd's WatchdogSec (sd_watchdog_enabled(3)), None if off.

    systemd passes WATCHDOG_USEC and WATCHDOG_PID; a WATCHDOG_PID that is not ours means the variables
    were inherited from a parent that is watched, not us."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2_000_000 if value > 0 else None
