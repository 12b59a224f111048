"""systemd's notify protocol in a few lines: READY=1, WATCHDOG=1, STATUS=..."""

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
