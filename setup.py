"""Builds PairMQ, compiling the hot modules with mypyc (the list: `[tool.pairmq] compiled` in pyproject.toml).

Rules:
- `pip install .` and `pip install -e .` compile the list; with PAIRMQ_PURE_PYTHON=1 nothing is compiled and the
  compiled modules an earlier editable build left in the source tree are deleted (they would shadow the sources).
- mypyc names a module by its path, but the installed names are not the folders' (`pairmq.appliance` is the
  folder `appliance`): it reads the sources through a tree of symlinks, build/mypyc-src/pairmq/<folder>.
- The compiled code is one C file per module (mypyc's multi_file) plus mypyc's runtime, compiled on every core at
  once (ParallelBuildExt): gcc on one big file kept one core busy while the other waited.
- Each build records the SHA-256 of every compiled module's source in `appliance/_native_build.py`; at import,
  `appliance/native.py` refuses a compiled module whose source changed since (an editable install not rebuilt).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tomllib
from concurrent.futures import ThreadPoolExecutor

from setuptools import setup
from setuptools.command.build_ext import build_ext

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


class ParallelBuildExt(build_ext):
    """build_ext compiling an extension's C files concurrently (distutils compiles them one after another)."""

    def build_extensions(self) -> None:
        compile_one = self.compiler.compile
        jobs = os.cpu_count() or 1

        def compile_all(sources: list[str], *args: object, **kwargs: object) -> list[str]:
            with ThreadPoolExecutor(jobs) as pool:  # each call runs gcc on one file: threads only wait
                return [obj for objs in pool.map(lambda s: compile_one([s], *args, **kwargs), sources) for obj in objs]

        self.compiler.compile = compile_all
        super().build_extensions()


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
    target = ROOT / "build" / "mypyc"
    extensions = mypycify(paths, group_name=GROUP, target_dir=str(target), opt_level="3", multi_file=True)
    for extension in extensions:  # multi_file writes the group's headers under its package, its C files above it
        extension.include_dirs.append(str(target.joinpath(*GROUP.split(".")[:-1])))
    return extensions


setup(ext_modules=ext_modules(), cmdclass={"build_ext": ParallelBuildExt})
