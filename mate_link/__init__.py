"""The mate link (TCP 8301): spool replication, resync and handover (docs/mate_link.md).

secure.py     handshake, sealed frames
messages.py   what the frames carry
resync.py     how a joining standby catches up
active.py     the active's end, sans-I/O
standby.py    the standby's end, sans-I/O
transport.py  one connection
service.py    the active's server and the standby's dialler on real spools
"""

from pairmq.appliance.native import check_installed as _check_installed

_check_installed()  # before any compiled module can be imported: docs/build.md
