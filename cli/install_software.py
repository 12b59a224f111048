"""The service venv of `pairmq install`: what pip puts into it, checked before anything changes, and what
an existing one holds.

Rules:
- What: the package spec (by default this source tree when run from one, else this very version of
  pairmq from the index) with the extras the group file needs (cli/extras.py).
- Checked before anything changes: `pip install --dry-run` in a scratch venv made the way the service
  venv will be made (so a host whose Python cannot make one is refused here too), deleted after.
- An existing venv is asked, by its own python in isolated mode (not this process's PYTHONPATH, which
  systemd/install.sh sets), which extras' modules it lacks and where its docs are: the units'
  Documentation= names the docs that venv really holds.
- Standard library only, like cli/install.py (systemd/install.sh runs it before any venv exists).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pairmq.appliance.errors import PairMQError

from .extras import EXTRAS

PROJECT = Path(__file__).resolve().parent.parent
_NAME = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[([^\]]*)\])?(.*)")


class InstallError(PairMQError):
    """A refusal: one sentence, nothing changed."""


def default_package() -> str:
    """This source tree when run from one; else the installed version, from the index."""
    if (PROJECT / "pyproject.toml").is_file():
        return str(PROJECT)
    return f"pairmq=={importlib.metadata.version('pairmq')}"


def with_extras(spec: str, extras: tuple[str, ...]) -> str:
    """`spec` asking for `extras` too: `path[vip]`, `pairmq[vip]==0.1.0`, `pairmq[analytics,vip]`."""
    if not extras:
        return spec
    named = _NAME.fullmatch(spec)
    if named is None or "/" in spec or os.path.exists(spec):  # a path or a file: pip takes path[extra]
        return f"{spec}[{','.join(sorted(extras))}]"
    have = {e.strip() for e in (named.group(2) or "").split(",") if e.strip()}
    return f"{named.group(1)}[{','.join(sorted(have | set(extras)))}]{named.group(3)}"


def check_resolvable(spec: str, pip_options: tuple[str, ...], venv: Path) -> None:
    """Refuse unless pip would install `spec` into a fresh venv: the build requirements, the dependencies
    and the extras all found with these options."""
    scratch = Path(tempfile.mkdtemp(prefix="pairmq-install-check-"))
    try:
        run([sys.executable, "-m", "venv", str(scratch)],
            f"{sys.executable} cannot make a virtual environment for {venv}")
        run([str(scratch / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet", *pip_options, spec],
            f"pip would not install {spec} into {venv}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def missing_extras(python: Path, extras: tuple[str, ...]) -> tuple[str, ...]:
    """The extras whose modules `python` (an existing venv's) cannot find."""
    modules = [m for e in extras for m in EXTRAS[e][1]]
    if not modules:
        return ()
    code = ("import importlib.util, json, sys; "
            "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))")
    try:
        done = subprocess.run([str(python), "-I", "-c", code, *modules], capture_output=True, text=True, timeout=60)
        absent = set(json.loads(done.stdout)) if done.returncode == 0 else set(modules)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        absent = set(modules)
    return tuple(e for e in extras if absent & set(EXTRAS[e][1]))


def docs_location(python: Path, root: Path) -> Path | None:
    """operations.md as the venv's own pairmq has it, seen from the target system; None if it has none."""
    code = ("import importlib.resources as r; p = r.files('pairmq.docs').joinpath('operations.md'); "
            "print(p if p.is_file() else '')")
    try:
        done = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = done.stdout.strip()
    if done.returncode != 0 or not found:
        return None
    path = Path(found)
    if root != Path("/") and path.is_relative_to(root):
        return Path("/") / path.relative_to(root)
    return path


def install_into(python: Path, spec: str, pip_options: tuple[str, ...], venv: Path) -> None:
    run([str(python), "-m", "pip", "install", "--quiet", *pip_options, spec], f"pip could not install {spec} into {venv}")


def run(argv: list[str], failure: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True)
    except FileNotFoundError:
        raise InstallError(f"{failure}: {argv[0]} is not installed") from None
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        # pip's own reason is its last "ERROR:" line; its last words are a "note:" about subprocesses
        detail = ([line for line in lines if line.startswith("ERROR:")] or lines or [f"exit code {done.returncode}"])[-1]
        raise InstallError(f"{failure}: {detail}")
