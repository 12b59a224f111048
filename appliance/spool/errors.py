"""The spool's errors.

Corruption of the file on disk is `appliance.errors.SpoolCorruption` (shared
with the quorum's stable file). These are the spool's own:

- `OpCodecError`: bytes that are not a well-formed op. From our own file the
  store reports it as `SpoolCorruption`; from the mate link it is the peer's
  fault (`RemoteProtocolError`).
- `ChainError`: an op whose (epoch, seq, checksum) does not follow its
  predecessor. Same two readings as above.
- `SpoolFull`: the configured byte limit or the disk is full; the ops were not
  applied (nothing half-applied) and must not be acknowledged.
- `SpoolBusy`: the writer's backlog is at its bound; the caller should stop
  reading publishers until commits catch up (the backlog is `pending_ops`).
- `SpoolLocked`: another process holds this spool directory.
"""

from __future__ import annotations

from ..errors import PairMQError


class OpCodecError(PairMQError, ValueError):
    """Bytes that do not decode to exactly one well-formed op (or an op that cannot be encoded)."""


class ChainError(PairMQError):
    """An op log entry that does not chain to its predecessor."""

    def __init__(self, seq: int, message: str) -> None:
        super().__init__(message)
        self.seq = seq


class SpoolFull(PairMQError):
    """The spool's byte limit or the disk is full: the ops were refused and nothing of them applied."""


class SpoolBusy(PairMQError):
    """The writer's backlog is at its bound: stop reading publishers until commits catch up."""


class SpoolLocked(PairMQError):
    """Another process already serves from this spool directory."""
