"""The hot modules (pyproject.toml `[tool.pairmq]`) are clean under `mypy --strict`: mypyc compiles them from their
types, so a type error is a build that fails or code that raises TypeError at run time. And the build is what it
says: compiled modules are the compiled ones (unless PAIRMQ_PURE_PYTHON=1), built from the sources beside them."""

from __future__ import annotations

import hashlib
import importlib
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

from pairmq.appliance import native

REPO = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
FOLDERS = PYPROJECT["tool"]["setuptools"]["package-dir"]
COMPILED = PYPROJECT["tool"]["pairmq"]["compiled"]
TYPED = COMPILED + PYPROJECT["tool"]["pairmq"].get("typed", [])
PURE = os.environ.get("PAIRMQ_PURE_PYTHON") == "1"


def test_the_hot_modules_are_clean_under_mypy_strict():
    # mypy names modules by path: it reads the folders through pairmq/<name> symlinks, as setup.py's mypyc does.
    stage = REPO / "build" / "mypy-src"
    (stage / "pairmq").mkdir(parents=True, exist_ok=True)
    for name, folder in FOLDERS.items():
        link = stage / "pairmq" / name.split(".")[1]
        if not link.is_symlink():
            link.symlink_to(REPO / folder, target_is_directory=True)
    files = [str(stage.joinpath(*m.split(".")[:-1], m.split(".")[-1] + ".py")) for m in TYPED]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(REPO / "build" / "mypy-cache"), *files],
        cwd=stage, env={**os.environ, "MYPYPATH": str(stage)}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"no issues found in {len(files)} source files" in result.stdout


def test_the_build_compiles_with_the_mypy_the_gate_checks_with():
    import build_backend
    assert build_backend.MYPYC == [r for r in PYPROJECT["project"]["optional-dependencies"]["test"]
                                   if r.startswith("mypy")]


@pytest.mark.parametrize("module", COMPILED)
def test_each_listed_module_is_compiled_unless_the_build_is_pure(module):
    path = importlib.import_module(module).__file__
    assert path is not None
    if PURE:
        assert path.endswith(".py"), f"{module} is compiled in a pure build: {path}"
    else:
        assert path.endswith(".so"), f"{module} is not compiled ({path}): run `bash .ci/setup`"


def test_the_build_record_names_the_sources_beside_the_compiled_modules():
    from pairmq.appliance._native_build import SOURCES
    assert sorted(SOURCES) == ([] if PURE else sorted(COMPILED))
    for module, (relative, digest) in SOURCES.items():
        assert hashlib.sha256((REPO / relative).read_bytes()).hexdigest() == digest, f"{module}: stale build"


def _tree(tmp_path: pathlib.Path, source: bytes, *, compiled: bool) -> dict[str, tuple[str, str]]:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "hot.py").write_bytes(source)
    if compiled:  # only its presence matters to the guard
        (tmp_path / "pkg" / "hot.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    return {"pairmq.pkg.hot": ("pkg/hot.py", hashlib.sha256(b"x = 1\n").hexdigest())}


def test_the_guard_refuses_a_compiled_module_whose_source_changed(tmp_path):
    sources = _tree(tmp_path, b"x = 2\n", compiled=True)
    with pytest.raises(native.StaleCompiledModule, match=r"pairmq.pkg.hot .* rebuild it with `bash .ci/setup`"):
        native.check(tmp_path, sources)


def test_the_guard_passes_the_same_source_and_a_source_without_a_compiled_module(tmp_path):
    native.check(tmp_path, _tree(tmp_path, b"x = 1\n", compiled=True))
    native.check(tmp_path, {"pairmq.pkg.cold": ("pkg/cold.py", "0" * 64)})  # no compiled file: nothing shadowed


@pytest.mark.compiled
def test_the_guard_on_the_installed_tree_refuses_a_digest_that_is_not_its_sources():
    """A fresh interpreter, the real compiled module and its real source, a record that disagrees with it."""
    code = ("import pairmq.appliance.native as n, pathlib\n"
            f"n.check(pathlib.Path({str(REPO)!r}), {{'{COMPILED[0]}': "
            f"(__import__('pairmq.appliance._native_build', fromlist=['S']).SOURCES['{COMPILED[0]}'][0], "
            "'0' * 64)})\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "StaleCompiledModule" in result.stderr and "rebuild it with `bash .ci/setup`" in result.stderr
