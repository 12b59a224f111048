"""The optional parts of PairMQ and what each needs: a missing one is one sentence naming the pip command.

Rules:
- A host installs what it runs: the node and the CLI come with the base install; `pairmq analytics`
  needs the `analytics` extra (and a Java runtime), a group file with [vip] needs the `vip` extra.
- A missing extra is found before the work starts, by looking the modules up (nothing is imported), and
  ends the command with exit 2 (a setup problem, not a failure of the work) and this one sentence.
- The modules listed here are the ones the code imports; pyproject.toml's extras are what pip installs
  for them. cli/install.py builds a service venv with the extras its group file needs from the same table.
"""

from __future__ import annotations

import importlib.util

from pairmq.appliance.errors import PairMQError

EXIT_MISSING_EXTRA = 2

# extra -> (what needs it, the modules it provides)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "analytics": ("pairmq analytics", ("pyspark", "pyarrow", "pandas", "matplotlib")),
    "vip": ("the virtual IP ([vip] in the group file)", ("pyroute2", "scapy")),
}


class MissingExtra(PairMQError):
    """An optional part is not installed: one sentence with the command that installs it."""

    exit_code = EXIT_MISSING_EXTRA


def missing_modules(extra: str) -> list[str]:
    return [name for name in EXTRAS[extra][1] if importlib.util.find_spec(name) is None]


def require(extra: str) -> None:
    """Raise MissingExtra unless every module of `extra` can be imported."""
    missing = missing_modules(extra)
    if missing:
        what, _ = EXTRAS[extra]
        raise MissingExtra(f"{what} needs the {extra} extra ({', '.join(missing)} not installed): "
                           f"run pip install 'pairmq[{extra}]'")
