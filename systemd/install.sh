#!/bin/sh
# Set up this host to run its PairMQ node under systemd, from a source checkout, before any venv exists.
# A thin wrapper: the one implementation is cli/install.py (`pairmq install`), run with the system python3
# (3.11 or newer; it needs only the standard library). Arguments: see `systemd/install.sh --help`.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
exec env PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m cli.install "$@"
