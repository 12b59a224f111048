"""STYLE.md practice 1: the protocol and decision cores import no I/O, clock or randomness."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORBIDDEN = {"asyncio", "socket", "time", "random", "sqlite3", "aiohttp", "threading", "subprocess"}
CORES = [f"appliance/{name}" for name in (
    "quorum/wire.py", "quorum/auth.py", "quorum/core.py", "quorum/insync.py",
    "mqtt/wire.py", "mqtt/properties.py", "mqtt/codec.py", "mqtt/publish.py", "mqtt/packets.py", "mqtt/__init__.py",
    "mqtt/overload.py", "mqtt/session.py", "mqtt/plain_publish.py",
    "broker/topics.py", "broker/retained.py", "broker/session.py", "broker/core.py", "broker/routing.py",
    "broker/access.py",
    "spool/ops.py", "spool/codec.py", "spool/chain.py", "spool/state.py", "spool/snapshot.py",
)] + ["mate_link/secure.py", "mate_link/messages.py", "mate_link/resync.py", "mate_link/active.py", "mate_link/standby.py"]


@pytest.mark.parametrize("name", CORES)
def test_core_imports_no_io(name):
    tree = ast.parse((ROOT / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mods = {(node.module or "").split(".")[0]} if node.level == 0 else set()
        else:
            continue
        assert not mods & FORBIDDEN, f"{name} imports {mods & FORBIDDEN}"
