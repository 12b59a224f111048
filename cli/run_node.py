"""`pairmq node`: one node in the foreground, logging to stderr (what systemd runs).

Every log record is exactly one line (time, level, logger, message), so a
journal or a log file stays greppable even when a record carries a traceback.
The one exception: a fatal signal in native code (SIGSEGV in libsqlite3,
SIGBUS, SIGABRT...) makes `faulthandler` write every thread's Python stack to
the same stderr before the process dies, the only trace of which thread was in
C at the time (docs/reliability.md).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from pairmq.appliance.config import load_group, load_secret
from pairmq.appliance.errors import PairMQError
from pairmq.appliance.private_files import PRIVATE_UMASK
from pairmq.appliance.roles import Role

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


class OneLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\n", " | ")


def configure_logging(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(LOG_FORMAT, LOG_DATE_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def run(group_path: Path, role: Role) -> int:
    os.umask(PRIVATE_UMASK)  # before anything is created: spool, events and secrets are nobody else's business
    config = load_group(group_path)
    if role.routes_messages and config.vip is not None:
        from .extras import require

        require("vip")
    load_secret(config)  # a bad group file, secret, access file or config store is one sentence, before any log line
    if role.routes_messages:
        from pairmq.appliance.access_file import access_path, load_access
        from pairmq.configsync.store import ConfigStore, store_path

        load_access(access_path(config.node(role).data_dir))
        if store_path(config.node(role).data_dir).exists():
            ConfigStore(store_path(config.node(role).data_dir)).close()
    configure_logging()
    faulthandler.enable(sys.stderr, all_threads=True)  # see the module's rules: a native crash names its thread
    # Until the node's event loop installs its own handler, SIGTERM still means a clean exit 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    from pairmq.appliance.node.process import run_node

    logging.getLogger("pairmq.cli").info("%s: starting with group %s (%s)", role.value, config.name, group_path)
    try:
        run_node(config, role)
    except OSError as exc:
        if exc.filename:
            raise PairMQError(f"the {role.value} node cannot use {exc.filename}: {exc.strerror or exc}") from None
        spec = config.node(role)
        tls = f", MQTT over TLS {config.ports.mqtt_tls}" if config.tls is not None and role.routes_messages else ""
        raise PairMQError(f"the {role.value} node could not open its sockets on {spec.address} (heartbeat "
                          f"{config.ports.heartbeat}, MQTT {config.ports.mqtt}{tls}, management "
                          f"{config.ports.management}): {exc.strerror or exc}") from None
    logging.getLogger("pairmq.cli").info("%s: stopped", role.value)
    _exit_now()
    return 0


def _exit_now() -> None:
    """Exit 0 without the interpreter's teardown: everything the node opened is closed by now, and tearing
    down the modules and heap is CPU time `systemctl stop` would wait for on every host. Not under cProfile
    (bench/), which writes its profile at exit, nor while a thread the interpreter would wait for still runs."""
    if sys.getprofile() is not None or any(t.is_alive() and not t.daemon and t is not threading.main_thread()
                                           for t in threading.enumerate()):
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
