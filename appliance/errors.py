"""PairMQ's error hierarchy.

A peer's fault (a malformed datagram, a bad MQTT packet) is counted and refused
with a `RemoteProtocolError`; an operator's fault (a bad group file, a missing
secret) is a `ConfigError` with one clear sentence; a broken file on disk is a
`SpoolCorruption`. Our own bugs are assertions, not members of this tree.
"""


class PairMQError(Exception):
    """Base class for every error PairMQ reports to a person."""


class ConfigError(PairMQError):
    """The group file, secret or per-host settings are missing or invalid."""


class RemoteProtocolError(PairMQError):
    """A peer sent something we refuse (counted, never fatal)."""


class LocalProtocolError(PairMQError):
    """We were asked to do something the protocol forbids in this state."""


class SpoolCorruption(PairMQError):
    """A durable file failed its integrity check; we refuse to serve from it."""
