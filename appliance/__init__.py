"""PairMQ appliance."""

from pairmq.appliance.native import check_installed as _check_installed

_check_installed()  # before any compiled module can be imported: docs/build.md
