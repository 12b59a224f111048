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

import fcntl
import fnmatch
import os
import shutil
import tempfile
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
#   nodes wait on real timers before the CPU-bound simulators and Spark (the netns chain, the longest, first of
#   all); within each part the longest scopes first, so that no long one starts last and leaves a worker idle.
# - Spark's JVMs starve the timers of nodes beside them: a module of JVM_SCOPES holds a lock exclusive of every
#   module of TIMED_SCOPES and of every other JVM module (pytest_runtest_protocol below), so none of them starts on
#   one worker while the other runs on another. The scheduler (ByScope, choose) gives a worker the first scope in
#   SCOPE_ORDER that conflicts with nothing unfinished on the other workers: a JVM scope conflicts with a timed or
#   a JVM one, and a CPU-bound one with a timed one and another CPU-bound one (beside timers, one core is theirs).
#   Failing that, the first that is not a JVM scope if another worker already has one (it would wait for that
#   whole JVM module), else the first: it waits for the lock. A worker never waits for the scheduler itself:
#   xdist runs a worker's last test only once the worker has more work.
WORKERS = 3  # the timed scopes mostly wait on their timers: the third worker runs them where two left a core idle
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
TIMED_SCOPES = ("netns", "tests/processes/")
JVM_SCOPES = ("spark", "tests/processes/test_analytics_")
# - On the uncompiled build (PAIRMQ_PURE_PYTHON=1, .venv-pure: docs/build.md) the suite is PURE_SUBSET only: the
#   unit tests of the compiled modules and of what drives them, which the whole suite runs compiled, except
#   those marked `compiled` (they check the compiled build itself). With `--whole-suite` it is every test but
#   those marked `compiled`: by hand, not in CI (docs/build.md), as the same behaviour on both builds is the rule.
PURE_SUBSET = ("tests/unit/test_broker_*", "tests/unit/test_mqtt_*", "tests/unit/test_quorum_*",
               "tests/unit/test_heartbeat_*", "tests/unit/test_topics.py", "tests/unit/test_session_owners.py",
               "tests/unit/test_sans_io.py", "tests/unit/test_types.py", "tests/unit/test_explicit_init.py",
               "tests/unit/test_hostile_codec.py", "tests/unit/test_hostile_units.py",
               "tests/unit/test_spool_codec.py", "tests/unit/test_spool_segments.py",
               "tests/unit/test_mate_link_messages.py", "tests/unit/test_mate_link_replication.py",
               # the spool's ops, its state model and the standby's end of the mate link
               "tests/unit/test_spool_ops.py", "tests/unit/test_spool_store.py", "tests/unit/test_spool_writer.py",
               "tests/unit/test_spool_snapshot.py", "tests/unit/test_spool_image.py",
               # per-message events: read off the ops on the loop, their lines made on the log's writer thread
               "tests/unit/test_eventlines.py", "tests/unit/test_eventlog.py")
PURE = os.environ.get("PAIRMQ_PURE_PYTHON") == "1"


def pure_subset_only(config: pytest.Config) -> bool:
    """Whether this run keeps only PURE_SUBSET: the uncompiled build, without --whole-suite."""
    return PURE and not config.getoption("--whole-suite")


def pure_keeps(item: pytest.Item) -> bool:
    """Whether an uncompiled run keeps this collected test."""
    in_subset = any(fnmatch.fnmatch(item.nodeid.split("::")[0], pattern) for pattern in PURE_SUBSET)
    return (in_subset or not pure_subset_only(item.config)) and not item.get_closest_marker("compiled")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemesis", "fault-injection suite (tests/netns/test_nemesis.py)")
    group.addoption("--soak", type=float, metavar="MINUTES", default=None,
                    help="run the nemesis with random seeds for this many minutes instead of the CI seeds")
    group.addoption("--seed", type=int, metavar="N", default=None, help="run the nemesis with this one seed")
    group.addoption("--report", metavar="PATH", default=None, help="directory for the nemesis report")
    parser.getgroup("fuzz", "coverage-guided fuzzing (tests/sim/test_hostile_fuzz.py)").addoption(
        "--fuzz-minutes", type=float, metavar="MINUTES", default=None,
        help="fuzz each decoder for this many minutes instead of the CI's fixed number of inputs")
    parser.getgroup("build", "the uncompiled build (PAIRMQ_PURE_PYTHON=1, docs/build.md)").addoption(
        "--whole-suite", action="store_true",
        help="on the uncompiled build, run every test but those marked `compiled`, not only PURE_SUBSET")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """On the uncompiled build a test file outside PURE_SUBSET is not even imported: its imports (Spark, the
    harness) cost each worker seconds for tests it would deselect."""
    if not pure_subset_only(config) or not collection_path.is_relative_to(config.rootpath) \
            or collection_path.is_dir() or not collection_path.name.startswith("test_"):
        return None
    nodeid = collection_path.relative_to(config.rootpath).as_posix()
    return None if any(fnmatch.fnmatch(nodeid, pattern) for pattern in PURE_SUBSET) else True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if PURE:
        kept = [item for item in items if pure_keeps(item)]
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
    else:  # before xdist starts the workers, which inherit it: one lock file per run
        os.environ["PAIRMQ_SUITE_LOCK"] = str(Path(tempfile.mkdtemp(prefix="pairmq-suite-")) / "beside-jvm.lock")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") and "PAIRMQ_SUITE_LOCK" in os.environ:
        shutil.rmtree(Path(os.environ.pop("PAIRMQ_SUITE_LOCK")).parent, ignore_errors=True)


def scope_of(nodeid: str) -> str:
    for scope, prefixes in SHARED_SCOPES.items():
        if nodeid.startswith(prefixes):
            return scope
    return nodeid if nodeid.startswith(SPLIT_SCOPES) else nodeid.split("::", 1)[0]


def rank_of(scope: str) -> int:
    """The place of a scope in SCOPE_ORDER: that of the longest entry it starts with; after them all if none."""
    matches = [(len(first), i) for i, first in enumerate(SCOPE_ORDER) if scope.startswith(first)]
    return max(matches)[1] if matches else len(SCOPE_ORDER)


def kind_of(scope: str) -> str:
    """"jvm", "timed" or "cpu" (simulators, unit tests and any other): what may run beside what."""
    if scope.startswith(JVM_SCOPES):
        return "jvm"
    return "timed" if scope.startswith(TIMED_SCOPES) else "cpu"


def conflicts(kind: str, elsewhere: list[str]) -> bool:
    """Whether a scope of this kind would run beside the unfinished scopes of the other workers badly."""
    if kind == "jvm":
        return "timed" in elsewhere or "jvm" in elsewhere
    return kind == "cpu" and "timed" in elsewhere and "cpu" in elsewhere


def choose(queue: list[str], elsewhere: list[str]) -> str:
    """The scope a worker starts next, given the queue in order and the kinds unfinished on the other workers."""
    fine = [scope for scope in queue if not conflicts(kind_of(scope), elsewhere)]
    not_jvm = [scope for scope in queue if kind_of(scope) != "jvm"] if "jvm" in elsewhere else []
    return (fine or not_jvm or queue)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.option.dist != "loadscope":
        return None  # another --dist asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            elsewhere = [kind_of(scope) for other, work in self.assigned_work.items() if other is not node
                         for scope, tests in work.items() if not all(tests.values())]
            scope = choose(list(self.workqueue), elsewhere)
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    config.option.loadscopereorder = False  # keep the collection's order: SCOPE_ORDER
    return ByScope(config, log)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # around pytest-timeout's: the wait is not the test's time
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A JVM module holds the run's lock exclusively, a timed one shared, from its first test's set-up (a session
    fixture such as the shared SparkSession starts there) to its last one's teardown. A worker going on to a
    module of the same kind keeps the lock it holds: a JVM module waiting on another worker would take it
    in between and leave that worker's next timed module waiting for the whole JVM module."""
    kind = kind_of(scope_of(item.nodeid))
    if kind != "cpu" and _held.get("kind") != kind:
        lock = open(os.environ["PAIRMQ_SUITE_LOCK"], "w")
        fcntl.flock(lock, fcntl.LOCK_EX if kind == "jvm" else fcntl.LOCK_SH)
        _held.update(kind=kind, file=lock)
    yield
    if _held and (nextitem is None or kind_of(scope_of(nextitem.nodeid)) != _held["kind"]):
        _held.pop("file").close()  # closing the file releases its lock
        _held.clear()


_held: dict = {}  # this worker's lock while its modules of one kind run: {"kind": "jvm" or "timed", "file": ...}


def mark_and_order(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else ""
        if folder in FOLDER_MARKS:
            item.add_marker(FOLDER_MARKS[folder])
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike, or xdist refuses the collections
        items.sort(key=lambda item: rank_of(scope_of(item.nodeid)))
