"""Config-sync (TCP 8302): replicated, versioned configuration (docs/config_sync.md).

document.py   the replicated configuration and its validation
changes.py    a change: the unit config-sync orders, stores, chains and ships
store.py      the versioned store: one SQLite file per routing node
exchange.py   what two nodes send to converge, sans-I/O
service.py    the active's server on 8302 and the standby's follower
"""
