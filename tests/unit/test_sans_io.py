"""STYLE.md practices 1-3: the cores import no I/O, clock or randomness and share one set of verbs; the
quorum's decisions follow their transition table; the installed packages form layers without cycles.

Rules checked here:
- A core is every module of the core packages that is not named an adapter below, so a new module is
  checked without being listed. A core imports none of FORBIDDEN, and of PairMQ only cores and the
  foundation (an adapter's imports would bring the I/O back in).
- Every protocol core has `receive(..., now_ms)`, `handle_timer(now_ms)`, `get_timer()` and a
  `*_to_send()` drain.
- The import graph of the installed `pairmq.*` packages (every import in a module, lazy ones too) has
  no cycle, and no module imports from a layer above its own (LAYERS, highest first).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import itertools
import pathlib

import pytest

from pairmq.appliance.quorum.core import QuorumCore
from pairmq.appliance.quorum.decisions import TRANSITIONS, DecisionKind, next_activity
from pairmq.appliance.quorum.wire import Activity
from pairmq.configsync.exchange import ActiveEnd, StandbyEnd
from pairmq.mate_link.active import ActiveLink
from pairmq.mate_link.standby import StandbyLink

FORBIDDEN = {"asyncio", "socket", "time", "random", "sqlite3", "aiohttp", "threading", "subprocess", "select"}
CORE_PACKAGES = ("pairmq.appliance.quorum", "pairmq.appliance.mqtt", "pairmq.appliance.broker", "pairmq.appliance.spool",
                 "pairmq.configsync", "pairmq.mate_link")
ADAPTERS = {  # the I/O around the cores: thin and mechanical
    "pairmq.appliance.mqtt.connection", "pairmq.appliance.mqtt.connects", "pairmq.appliance.mqtt.listener",
    "pairmq.appliance.mqtt.websockets", "pairmq.appliance.mqtt.tls_accept", "pairmq.appliance.mqtt.traffic",
    "pairmq.appliance.broker.authn", "pairmq.appliance.broker.service",
    "pairmq.appliance.spool.image", "pairmq.appliance.spool.install", "pairmq.appliance.spool.segments",
    "pairmq.appliance.spool.checkpoint", "pairmq.appliance.spool.store", "pairmq.appliance.spool.writer",
    "pairmq.appliance.spool.local", "pairmq.appliance.spool.legacy.load", "pairmq.appliance.spool.legacy.sql",
    "pairmq.appliance.spool.legacy.migrate", "pairmq.appliance.spool.verify",
    "pairmq.configsync.service", "pairmq.configsync.store",
    "pairmq.mate_link.service", "pairmq.mate_link.transport",
}
PURE_ANALYTICS = {"pairmq.analytics.partials", "pairmq.analytics.transforms", "pairmq.analytics.schema",
                  "pairmq.analytics.xxhash64"}
PROTOCOL_CORES = [QuorumCore, ActiveEnd, StandbyEnd, ActiveLink, StandbyLink]

# Highest first: a module may import from its own layer and those below it, never from one above.
LAYERS = [
    ("cli", ("pairmq.cli",)),
    ("node", ("pairmq.appliance.node", "pairmq.monitor")),
    ("api", ("pairmq.appliance.api",)),
    ("links", ("pairmq.mate_link", "pairmq.configsync", "pairmq.analytics")),
    ("cores", ("pairmq.appliance.broker", "pairmq.appliance.mqtt", "pairmq.appliance.quorum", "pairmq.appliance.spool",
               "pairmq.appliance.access_file", "pairmq.appliance.stable_file")),
    ("foundation", ("pairmq.appliance.errors", "pairmq.appliance.roles",
                    "pairmq.appliance.native", "pairmq.appliance._native_build",
                    "pairmq.appliance.clock", "pairmq.appliance.config", "pairmq.appliance.private_files",
                    "pairmq.appliance.keyring", "pairmq.appliance.eventlog", "pairmq.appliance.eventlines",
                    "pairmq.appliance.tls",
                    "pairmq.appliance.management_settings", "pairmq.appliance.hooks_settings",
                    "pairmq.appliance.instruments")),
]


# --- the import graph ----------------------------------------------------------------------------------------------

def _modules() -> dict[str, pathlib.Path]:
    """Every module of the installed pairmq packages, by name, wherever setuptools maps its folder."""
    out = {}
    for package in ("pairmq.appliance", "pairmq.mate_link", "pairmq.configsync", "pairmq.monitor", "pairmq.cli",
                    "pairmq.analytics"):
        root = pathlib.Path(next(iter(importlib.util.find_spec(package).submodule_search_locations)))
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _type_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements under `if TYPE_CHECKING:`, which never run and so cannot close a cycle."""
    return {n for block in ast.walk(tree) if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
            for stmt in block.body for n in ast.walk(stmt)}


def _imports(name: str, path: pathlib.Path, known: dict, *, runtime: bool = False) -> set[str]:
    """The modules `name` imports: absolute and relative, at the top or inside a function (`runtime`: not those
    imported for type checking only)."""
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    skip = _type_only(tree) if runtime else set()
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = base
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                module = f"{package}.{module}" if module else package
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    return found


MODULES = _modules()
GRAPH = {m: {t for t in _imports(m, p, MODULES) if t in MODULES and t != m} for m, p in MODULES.items()}
RUNTIME_GRAPH = {m: {t for t in _imports(m, p, MODULES, runtime=True) if t in MODULES and t != m}
                 for m, p in MODULES.items()}
RAW_IMPORTS = {m: _imports(m, p, MODULES) for m, p in MODULES.items()}


def _layer(module: str) -> int | None:
    """The rank of a module's layer (0 is the top): the longest prefix LAYERS names."""
    if module == "pairmq.appliance":  # the package's own (empty) __init__
        return len(LAYERS) - 1
    best, rank = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, i
    return rank


def _cycles() -> list[frozenset[str]]:
    """The strongly connected components of more than one module in what runs (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(RUNTIME_GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(frozenset(component))

    for v in sorted(RUNTIME_GRAPH):
        if v not in index:
            visit(v)
    return out


def _upward() -> set[tuple[str, str]]:
    return {(m, t) for m, targets in GRAPH.items() for t in targets
            if _layer(m) is not None and _layer(t) is not None and _layer(t) < _layer(m)}


def test_every_module_has_a_layer():
    assert [m for m in sorted(MODULES) if _layer(m) is None] == []


def test_no_import_cycle():
    found = set(_cycles())
    assert sorted(map(sorted, found)) == [], "import cycles"


def test_no_upward_import():
    found = _upward()
    assert sorted(found) == [], "imports from a higher layer"


def test_the_graph_sees_lazy_and_relative_imports():
    """The walk would miss cycles if it missed these: `from . import x` inside a function, and `..` paths."""
    assert "pairmq.cli.run_node" in GRAPH["pairmq.cli.main"]  # `from .run_node import run` in a handler
    assert "pairmq.appliance.errors" in GRAPH["pairmq.appliance.quorum.core"]  # `from ..errors import ...`


# --- the cores -----------------------------------------------------------------------------------------------------

CORES = sorted(m for m in MODULES if (m.startswith(CORE_PACKAGES) and m not in ADAPTERS) or m in PURE_ANALYTICS)
FOUNDATION = {m for m in MODULES if _layer(m) == len(LAYERS) - 1}


def test_the_core_list_is_not_empty_and_names_real_adapters():
    assert len(CORES) > 40 and "pairmq.appliance.quorum.core" in CORES and "pairmq.configsync.exchange" in CORES
    assert ADAPTERS <= set(MODULES)


@pytest.mark.parametrize("name", CORES)
def test_core_imports_no_io(name):
    top = {m.split(".")[0] for m in RAW_IMPORTS[name]}
    assert not top & FORBIDDEN, f"{name} imports {top & FORBIDDEN}"
    others = {t for t in GRAPH[name] if t not in CORES and t not in FOUNDATION - {"pairmq.appliance.clock"}}
    assert not others, f"{name} imports modules that are neither cores nor foundation: {sorted(others)}"


@pytest.mark.parametrize("core", PROTOCOL_CORES, ids=lambda c: c.__name__)
def test_every_protocol_core_speaks_the_same_verbs(core):
    receive = inspect.signature(core.receive)
    assert list(receive.parameters)[-1] == "now_ms"
    assert list(inspect.signature(core.handle_timer).parameters) == ["self", "now_ms"]
    assert list(inspect.signature(core.get_timer).parameters) == ["self"]
    assert [n for n in dir(core) if n.endswith("_to_send")], f"{core.__name__} has no *_to_send drain"


# --- the quorum's activity transitions -----------------------------------------------------------------------------

def test_every_decision_kind_is_legal_somewhere_and_only_two_change_activity():
    assert {k for row in TRANSITIONS.values() for k in row} == set(DecisionKind)
    changes = {(a, k, b) for a, row in TRANSITIONS.items() for k, b in row.items() if a is not b}
    assert changes == {(Activity.STANDBY, DecisionKind.ACTIVATE, Activity.ACTIVE),
                       (Activity.ACTIVE, DecisionKind.STEP_DOWN, Activity.STANDBY)}


@pytest.mark.parametrize("activity", list(Activity), ids=lambda a: a.name)
@pytest.mark.parametrize("kind", list(DecisionKind), ids=lambda k: k.value)
def test_the_transition_table_walked(activity, kind):
    if kind in TRANSITIONS[activity]:
        assert next_activity(activity, kind) is TRANSITIONS[activity][kind]
    else:
        with pytest.raises(AssertionError, match=f"{kind} decision is not legal while {activity.name.lower()}"):
            next_activity(activity, kind)


def test_the_monitor_never_leaves_none():
    assert set(TRANSITIONS[Activity.NONE].values()) == {Activity.NONE}


def test_decision_kinds_compare_as_their_words():
    """A StrEnum: what the event log, the API and the CLI compare and show is the plain word."""
    assert DecisionKind.STEP_DOWN == "step_down" and f"{DecisionKind.ACTIVATE}" == "activate"
