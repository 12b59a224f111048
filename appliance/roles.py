"""The three roles of a PairMQ group and the activity a node can be in."""

import enum


class Role(enum.Enum):
    PRIMARY = "primary"
    BACKUP = "backup"
    MONITOR = "monitor"

    # Members are singletons compared by identity: the identity hash is exact and in C (Enum's hashes the
    # name in Python; roles key the quorum core's dicts, asked several times per heartbeat).
    __hash__ = object.__hash__

    @property
    def routes_messages(self) -> bool:
        return self is not Role.MONITOR

    @property
    def wire_id(self) -> int:
        return _WIRE_IDS[self]

    @classmethod
    def from_wire(cls, value: int) -> "Role":
        return _ROLES_BY_WIRE[value]

    def mate(self) -> "Role":
        """The other message-routing node (primary <-> backup)."""
        assert self.routes_messages, "the monitor has no mate"
        return Role.BACKUP if self is Role.PRIMARY else Role.PRIMARY

    def peers(self) -> tuple["Role", ...]:
        return _PEERS[self]


_WIRE_IDS = {Role.PRIMARY: 1, Role.BACKUP: 2, Role.MONITOR: 3}
_ROLES_BY_WIRE = {v: k for k, v in _WIRE_IDS.items()}
_PEERS = {role: tuple(r for r in Role if r is not role) for role in Role}  # asked on every heartbeat
