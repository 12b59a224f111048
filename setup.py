"""Builds PairMQ, compiling the hot modules with mypyc (the list: `[tool.pairmq] compiled` in pyproject.toml).

Rules:
- `pip install .` and `pip install -e .` compile the list; with PAIRMQ_PURE_PYTHON=1 nothing is compiled and the
  compiled modules an earlier editable build left in the source tree are deleted (they would shadow the sources).
- mypyc names a module by its path, but the installed names are not the folders' (`pairmq.appliance` is the
  folder `appliance`): it reads the sources through a tree of symlinks, build/mypyc-src/pairmq/<folder>.
- Each build records the SHA-256 of every compiled module's source in `appliance/_native_build.py`; at import,
  `appliance/native.py` refuses a compiled module whose source changed since (an editable install not rebuilt).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tomllib

from setuptools import setup

ROOT = pathlib.Path(__file__).resolve().parent
STAGE = ROOT / "build" / "mypyc-src"
RECORD = ROOT / "appliance" / "_native_build.py"
GROUP = "pairmq.appliance._native"  # the shared library's name: inside a package, so an editable install finds it

pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
FOLDERS = {name: folder for name, folder in pyproject["tool"]["setuptools"]["package-dir"].items()}
COMPILED: list[str] = pyproject["tool"]["pairmq"]["compiled"]


def source_of(module: str) -> pathlib.Path:
    """The file of an installed module name, as `package-dir` maps it (pairmq.appliance.x -> appliance/x.py)."""
    top = ".".join(module.split(".")[:2])
    rest = module.split(".")[2:]
    return pathlib.Path(FOLDERS[top], *rest[:-1], rest[-1] + ".py")


def stage() -> list[str]:
    """The symlink tree mypyc reads; returns the compiled modules' paths inside it."""
    (STAGE / "pairmq").mkdir(parents=True, exist_ok=True)
    for name, folder in FOLDERS.items():
        link = STAGE / "pairmq" / name.split(".")[1]
        if not link.is_symlink():
            link.symlink_to(ROOT / folder, target_is_directory=True)
    return [str(STAGE.joinpath(*m.split(".")[:-1], m.split(".")[-1] + ".py")) for m in COMPILED]


def record(modules: list[str]) -> None:
    digests = {m: hashlib.sha256((ROOT / source_of(m)).read_bytes()).hexdigest() for m in modules}
    lines = [f'    "{m}": ("{source_of(m).as_posix()}", "{d}"),' for m, d in digests.items()]
    RECORD.write_text('"""Written by setup.py at each build: the sources the compiled modules were built from."""\n\n'
                      "SOURCES = {\n" + "\n".join(lines) + ("\n" if lines else "") + "}\n")


def remove_compiled() -> None:
    """A pure build: compiled modules left in the source tree by an editable build would shadow the sources."""
    for path in [*map(source_of, COMPILED), source_of(GROUP + "__mypyc")]:
        for so in (ROOT / path.parent).glob(path.stem + ".*.so"):
            so.unlink()


def ext_modules() -> list:
    if os.environ.get("PAIRMQ_BUILD_REQUIREMENTS_ONLY") == "1":
        return []  # build_backend.py asking setuptools for its requirements: mypy is not installed yet
    if os.environ.get("PAIRMQ_PURE_PYTHON") == "1":
        remove_compiled()
        record([])
        return []
    from mypyc.build import mypycify

    paths = stage()
    record(COMPILED)
    os.environ["MYPYPATH"] = str(STAGE)  # module names from the staged tree (explicit_package_bases)
    return mypycify(paths, group_name=GROUP, target_dir=str(ROOT / "build" / "mypyc"), opt_level="3")


setup(ext_modules=ext_modules())
