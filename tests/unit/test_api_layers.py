"""The management API sits below the node's wiring: nothing in appliance/api/ imports the node, the monitor's
node or the CLI, so the API reaches its node only through the ports the wiring hands it (appliance/api/ports.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pairmq.appliance.api as api

ABOVE = ("pairmq.appliance.node", "pairmq.monitor", "pairmq.cli")


def _imports(path: Path) -> list[str]:
    """Every module `path` imports, relative imports resolved against pairmq.appliance.api."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = "pairmq.appliance.api".split(".")[: 3 - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]  # `from .. import node`
    return names


def test_the_api_imports_nothing_above_it():
    files = sorted(Path(api.__file__).parent.glob("*.py"))
    assert len(files) >= 10
    upward = [(f.name, name) for f in files for name in _imports(f)
              if any(name == top or name.startswith(top + ".") for top in ABOVE)]
    assert upward == []
