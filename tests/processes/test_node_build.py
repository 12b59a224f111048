"""The node processes the suite starts run the build the suite runs on (docs/build.md): on the compiled build
(`.venv`) each node has the compiled modules' shared library mapped, built in this tree; on the uncompiled one
(`PAIRMQ_PURE_PYTHON=1`, `.venv-pure`) none of PairMQ's modules is an extension. Read from each node's own
`/proc/PID/maps`, what its dynamic loader actually loaded, so a run that says it is pure but starts nodes from
the compiled venv fails here rather than passing every other process test on the wrong build.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import tomllib
from pathlib import Path

from pairmq.appliance.roles import Role
from tests.harness.group import REPO, active_group

PURE = os.environ.get("PAIRMQ_PURE_PYTHON") == "1"
SHARED_LIBRARY = "_native__mypyc"  # setup.py: every compiled module's code, in pairmq.appliance
PACKAGES = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def package_folders() -> set[Path]:
    """Where PairMQ's modules may come from: this tree's folders (an editable install) and where this
    interpreter finds each package (a regular install, such as .venv-pure's)."""
    folders = {REPO / folder for folder in PACKAGES.values()}
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        folders.update(Path(p) for p in (spec.submodule_search_locations or []) if spec is not None)
    return folders


def mapped_extensions(pid: int) -> set[str]:
    """The Python extension modules (by file) a process has mapped."""
    paths = {line.split(maxsplit=5)[5].strip() for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
             if len(line.split(maxsplit=5)) == 6}
    return {p for p in paths if p.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))}


def pairmq_extensions(extensions: set[str]) -> set[str]:
    """Those of PairMQ: in one of its package folders, or its compiled modules' library wherever it is."""
    folders = package_folders()
    return {p for p in extensions if SHARED_LIBRARY in p or any(Path(p).is_relative_to(f) for f in folders)}


def test_each_node_runs_the_build_the_suite_runs_on(tmp_path):
    with active_group(tmp_path / "group") as g:
        for role in Role:
            pid = g.pid(role)
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert argv[0].decode() == sys.executable, f"the {role.value} runs {argv[0]!r}, not {sys.executable}"
            extensions = mapped_extensions(pid)
            assert extensions, f"the {role.value} has no extension module mapped: not a view of its loader"
            ours = pairmq_extensions(extensions)
            if PURE:
                assert not ours, f"the {role.value} of a pure run loaded compiled modules: {sorted(ours)}"
            else:
                shared = [p for p in ours if Path(p).name.startswith(SHARED_LIBRARY)]
                assert [Path(p).parent for p in shared] == [REPO / "appliance"], \
                    f"the {role.value} has not this tree's compiled modules mapped: {sorted(ours)}"
                assert REPO / "appliance" / "quorum" / f"wire{importlib.machinery.EXTENSION_SUFFIXES[0]}" \
                    in {Path(p) for p in ours}, f"the {role.value}'s heartbeat records are not compiled"
