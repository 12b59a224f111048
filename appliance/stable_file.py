"""The quorum core's stable store on disk: one small JSON file, replaced atomically.

A save is durable when it returns: write a temporary file, fsync it, rename it
over the old one, fsync the directory. A torn or corrupt file is refused with a
clear message rather than read as "epoch 0", which could let a node vote twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from .errors import SpoolCorruption
from .quorum.core import PersistentState
from .roles import Role


class FileStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> PersistentState:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return PersistentState()
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SpoolCorruption(f"quorum state {self.path} is unreadable ({exc}); refusing to start "
                                  "rather than forget the epochs this node voted in") from None
        try:
            voted_for = raw.pop("voted_for")
            state = PersistentState(**raw, voted_for=Role(voted_for) if voted_for else None)
            assert all(isinstance(v, int) and v >= 0 for k, v in raw.items())
        except (TypeError, ValueError, KeyError, AssertionError):
            raise SpoolCorruption(f"quorum state {self.path} has unexpected contents; refusing to start") from None
        return state

    def save(self, state: PersistentState) -> None:
        raw = dataclasses.asdict(state)
        raw["voted_for"] = state.voted_for.value if state.voted_for else None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(raw, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
