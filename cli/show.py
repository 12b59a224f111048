"""`pairmq show redundancy`: the whole group's redundancy state, once or live."""

from __future__ import annotations

import time

from rich.console import Group
from rich.text import Text

from pairmq.appliance.config import GroupConfig
from pairmq.appliance.errors import PairMQError

from . import api
from .render import redundancy_table, resync_table, vip_table
from .terminal import Terminal

WATCH_INTERVAL_S = 1.0


def title(config: GroupConfig) -> str:
    return f"Group {config.name}: redundancy"


def show_redundancy(term: Terminal, config: GroupConfig, *, as_json: bool, watch: bool) -> int:
    if watch and as_json:
        raise PairMQError("--watch and --json cannot be combined; use --json alone to poll from a script")
    if watch:
        return _watch(term, config)
    nodes = api.fetch_redundancy(config)
    api.require_one_reachable(config, nodes)
    if as_json:
        term.print_json(api.redundancy_document(config, nodes))
    else:
        term.print_table(redundancy_table(nodes, title=title(config)))
        if (resync := resync_table(nodes)) is not None:
            term.print_table(resync)
        if (vip := vip_table(nodes)) is not None:
            term.print_table(vip)
    return 0


def _watch(term: Terminal, config: GroupConfig) -> int:
    """Refresh until Ctrl-C; unreachable nodes stay on screen (they may come back)."""
    def frame() -> Group:
        nodes = api.fetch_redundancy(config)
        footer = Text(f"refreshed {time.strftime('%H:%M:%S')} every {WATCH_INTERVAL_S:g} s; Ctrl-C to stop",
                      style="dim")
        extra = [t for t in (resync_table(nodes), vip_table(nodes)) if t is not None]
        return Group(redundancy_table(nodes, title=title(config)), *extra, footer)

    try:
        with term.live(frame()) as live:
            while True:
                time.sleep(WATCH_INTERVAL_S)
                live.update(frame())
    except KeyboardInterrupt:
        return 0
