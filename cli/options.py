"""What every command shares: the `--group` option, where the group file is, and the examples epilog."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from pairmq.appliance.config import DEFAULT_GROUP_PATH

GROUP_ENV = "PAIRMQ_GROUP"


def examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def add_group(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", metavar="FILE", type=Path,
                        help=f"the group file (default: ${GROUP_ENV}, else {DEFAULT_GROUP_PATH})")


def group_path(args: argparse.Namespace) -> Path:
    if args.group is not None:
        return args.group
    return Path(os.environ[GROUP_ENV]) if os.environ.get(GROUP_ENV) else DEFAULT_GROUP_PATH
