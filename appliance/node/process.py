"""The process entry: one node in the foreground until SIGTERM (what systemd runs)."""

from __future__ import annotations

import asyncio
import gc

from ..config import GroupConfig
from ..roles import Role

# The heartbeat thread needs the GIL, and a full (generation 2) collection holds it throughout, for time
# that grows with the heap; a connection storm grows the heap in steps that would each trigger one under
# CPython's default thresholds. A full collection only after 1,000 younger ones keeps them out of a storm
# (docs/benchmarks.md, "Storm vs. lease"); cyclic garbage that old waits longer, reference counting frees the rest.
GC_THRESHOLDS = (700, 10, 1000)
# sys.getswitchinterval() stays at its default: a shorter one costs QoS 1 throughput on an active; only a
# standby catching up on the mate link runs at a shorter one meanwhile (mate_link/service.py _catching_up).


def run_node(config: GroupConfig, role: Role) -> None:
    """Run one node in the foreground until SIGTERM: a RoutingNode for the primary or backup, a MonitorNode
    for the monitor."""
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        import uvloop  # noqa: F401
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    if role.routes_messages:
        from .routing import RoutingNode as node_class
    else:
        from pairmq.monitor.node import MonitorNode as node_class
    runner(node_class(config, role).run())
