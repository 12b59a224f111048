"""How the suite runs (the rules below), and the command-line options of the fault-injection suite
(tests/netns/test_nemesis.py, docs/reliability.md):

    pytest tests/netns/test_nemesis.py                the bounded CI run (fixed seeds)
    pytest tests/netns/test_nemesis.py --soak 30      random seeds for 30 minutes; prints any failing seed
    pytest tests/netns/test_nemesis.py --seed 1234    rerun one seed's schedule
    ... --report DIR                                  also write the report (JSON and table) there

and of the coverage-guided fuzz run (tests/sim/test_hostile_fuzz.py, docs/security.md):

    pytest tests/sim/test_hostile_fuzz.py                     the bounded CI run (a fixed number of inputs per target)
    pytest tests/sim/test_hostile_fuzz.py --fuzz-minutes 10   each target for 10 minutes
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

import pytest

# Rules of a run, all in this file:
# - A test's folder marks it: tests/processes/ `processes`, tests/netns/ `netns` (a file adds its other marks).
# - The suite runs on WORKERS pytest-xdist workers unless told otherwise (`-n 0` or `-p no:xdist`: one process).
# - Each worker runs its groups on loopback addresses of its own: PAIRMQ_TEST_LOOPBACK (127.0.0.1 by default)
#   plus 10 × (worker number + 1), so groups of two workers never share an address or a ports lock.
# - A module runs whole on one worker (its module-scoped group starts once); the modules of a SHARED_SCOPES
#   entry run on one worker, one after another, because they share a resource. A simulator's test shares
#   nothing with its neighbours (no module-scoped fixtures in tests/sim/): each is a scope of its own, so the
#   blocks of one seeded run spread over the workers.
# - Scopes start in SCOPE_ORDER, a scope taking the place of the longest entry it starts with: the ones whose
#   nodes wait on real timers before the CPU-bound simulators and Spark, which would starve those timers if
#   they ran alongside (the netns chain, the longest, first of all); within each part the longest scopes first,
#   so that no long one starts last and leaves a worker idle at the end.
WORKERS = 2  # 3 starved the nodes of handover and failover tests beside the Spark tests; 4 did so too
FOLDER_MARKS = {"processes": "processes", "netns": "netns"}
SHARED_SCOPES = {
    "netns": ("tests/netns/", "tests/processes/test_sd_notify_processes.py"),  # namespaces, nft tables, root
    "spark": ("tests/unit/test_analytics_",),  # one SparkSession (tests/harness/spark_session.py) for them all
}
SPLIT_SCOPES = ("tests/sim/",)
SCOPE_ORDER = (
    "netns",
    "tests/processes/test_clean_venv.py", "tests/processes/test_install.py",  # minutes of pip each
    "tests/processes/",
    "tests/processes/test_analytics_cluster.py",  # a master, two workers, two drivers and their executors
    "spark",
    "tests/sim/test_quorum_random_schedules.py",
    "tests/processes/test_analytics_",  # a JVM each: the product's own `pairmq analytics`
    "tests/sim/",
)  # then the rest: tests/unit/ and any other
# - On the uncompiled build (PAIRMQ_PURE_PYTHON=1, .venv-pure: docs/build.md) the suite is PURE_SUBSET only: the
#   unit tests of the compiled modules and of what drives them, which the whole suite runs compiled, except
#   those marked `compiled` (they check the compiled build itself).
PURE_SUBSET = ("tests/unit/test_broker_*", "tests/unit/test_mqtt_*", "tests/unit/test_quorum_*",
               "tests/unit/test_heartbeat_*", "tests/unit/test_topics.py", "tests/unit/test_session_owners.py",
               "tests/unit/test_sans_io.py", "tests/unit/test_types.py", "tests/unit/test_explicit_init.py",
               "tests/unit/test_hostile_codec.py", "tests/unit/test_hostile_units.py",
               "tests/unit/test_spool_codec.py", "tests/unit/test_spool_segments.py",
               "tests/unit/test_mate_link_messages.py", "tests/unit/test_mate_link_replication.py",
               # the spool's ops, its state model and the standby's end of the mate link
               "tests/unit/test_spool_ops.py", "tests/unit/test_spool_store.py", "tests/unit/test_spool_writer.py",
               "tests/unit/test_spool_snapshot.py", "tests/unit/test_spool_image.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemesis", "fault-injection suite (tests/netns/test_nemesis.py)")
    group.addoption("--soak", type=float, metavar="MINUTES", default=None,
                    help="run the nemesis with random seeds for this many minutes instead of the CI seeds")
    group.addoption("--seed", type=int, metavar="N", default=None, help="run the nemesis with this one seed")
    group.addoption("--report", metavar="PATH", default=None, help="directory for the nemesis report")
    parser.getgroup("fuzz", "coverage-guided fuzzing (tests/sim/test_hostile_fuzz.py)").addoption(
        "--fuzz-minutes", type=float, metavar="MINUTES", default=None,
        help="fuzz each decoder for this many minutes instead of the CI's fixed number of inputs")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """On the uncompiled build a test file outside PURE_SUBSET is not even imported: its imports (Spark, the
    harness) cost each worker seconds for tests it would deselect."""
    if os.environ.get("PAIRMQ_PURE_PYTHON") != "1" or not collection_path.is_relative_to(config.rootpath) \
            or collection_path.is_dir() or not collection_path.name.startswith("test_"):
        return None
    nodeid = collection_path.relative_to(config.rootpath).as_posix()
    return None if any(fnmatch.fnmatch(nodeid, pattern) for pattern in PURE_SUBSET) else True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PAIRMQ_PURE_PYTHON") == "1":
        kept = [item for item in items if any(fnmatch.fnmatch(item.nodeid.split("::")[0], pattern)
                                              for pattern in PURE_SUBSET) and not item.get_closest_marker("compiled")]
        kept_ids = {id(item) for item in kept}
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept_ids])
        items[:] = kept
    mark_and_order(items)
    minutes = config.getoption("--soak")
    if minutes is not None and minutes <= 0:
        raise pytest.UsageError(f"--soak takes a positive number of minutes, not {minutes}")
    if minutes:  # the last seed started before the end runs to completion: allow it, plus set-up
        for item in items:
            if item.get_closest_marker("soak"):
                item.add_marker(pytest.mark.timeout(int(minutes * 60) + 900), append=False)  # before the test's own
    fuzz_minutes = config.getoption("--fuzz-minutes")
    if fuzz_minutes is not None and fuzz_minutes <= 0:
        raise pytest.UsageError(f"--fuzz-minutes takes a positive number of minutes, not {fuzz_minutes}")
    if fuzz_minutes:  # each fuzz target runs that long, plus atheris's start and a last slow input
        for item in items:
            if item.get_closest_marker("soak") and "test_hostile_fuzz" in item.nodeid:
                item.add_marker(pytest.mark.timeout(int(fuzz_minutes * 60) + 300), append=False)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Before xdist reads its options: no `-n` given means WORKERS, scheduled by scope_of."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.pluginmanager.hasplugin("xdist"):
        return  # a worker runs its share itself: it must not start workers of its own
    if config.option.numprocesses is None:
        config.option.numprocesses = WORKERS
    if config.option.dist == "no" and config.option.numprocesses:
        config.option.dist = "loadscope"


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...: set before any test module is imported
    if worker:
        first = os.environ.get("PAIRMQ_TEST_LOOPBACK", "127.0.0.1")
        base, last = first.rsplit(".", 1)
        os.environ["PAIRMQ_TEST_LOOPBACK"] = f"{base}.{int(last) + 10 * (int(worker[2:]) + 1)}"


def scope_of(nodeid: str) -> str:
    for scope, prefixes in SHARED_SCOPES.items():
        if nodeid.startswith(prefixes):
            return scope
    return nodeid if nodeid.startswith(SPLIT_SCOPES) else nodeid.split("::", 1)[0]


def rank_of(scope: str) -> int:
    """The place of a scope in SCOPE_ORDER: that of the longest entry it starts with; after them all if none."""
    matches = [(len(first), i) for i, first in enumerate(SCOPE_ORDER) if scope.startswith(first)]
    return max(matches)[1] if matches else len(SCOPE_ORDER)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.option.dist != "loadscope":
        return None  # another --dist asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # keep the collection's order: SCOPE_ORDER
    return ByScope(config, log)


def mark_and_order(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        if folder in FOLDER_MARKS:
            item.add_marker(FOLDER_MARKS[folder])
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike, or xdist refuses the collections
        items.sort(key=lambda item: rank_of(scope_of(item.nodeid)))
