#!/bin/sh
# Set up this host to run its PairMQ node under systemd, from a source checkout, before any venv exists.
# A thin wrapper: the one implementation is cli/install.py (`pairmq install`), run with the system python3
# (3.11 or newer; it needs only the standard library). Arguments: see `systemd/install.sh --help`.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
# The packages are imported as pairmq.*; before an install, a throwaway directory of links makes them so.
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
mkdir "$shim/pairmq"
for part in appliance mate_link configsync monitor cli analytics systemd docs; do ln -s "$here/$part" "$shim/pairmq/$part"; done
env PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m pairmq.cli.install "$@"
