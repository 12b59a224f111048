"""Running the broker core's effects as the adapter (appliance/broker/service.py) does, for tests.

`EffectRunner.run` executes effects in order and, at the end of the outermost call, the core's
`flush` (as the service does once per event-loop callback). `Durable` and `Connacked` go back to
the core; what a `Send`, a `Close` or a `Persist` means is the subclass's business.
"""

from __future__ import annotations

from pairmq.appliance.broker.core import Close, Connacked, Durable, Persist, Send


class EffectRunner:
    core: object
    now: int
    _depth = 0

    def run(self, effects) -> None:
        self._depth += 1
        try:
            for e in effects:
                if isinstance(e, Send):
                    self.on_send(e)
                elif isinstance(e, Close):
                    self.on_close(e)
                    if e.conn in self.core.connections:
                        self.run(self.core.connection_lost(e.conn, self.now))
                elif isinstance(e, Persist):
                    self.on_persist(e)
                elif isinstance(e, Durable):
                    self.run(self.core.durable(e, self.now))
                elif isinstance(e, Connacked):
                    self.run(self.core.connacked(e, self.now))
                else:
                    raise AssertionError(f"unknown effect {e!r}")
        finally:
            self._depth -= 1
        if self._depth == 0:
            more = self.core.flush(self.now)
            if more:
                self.run(more)

    def on_send(self, e: Send) -> None:
        raise NotImplementedError

    def on_close(self, e: Close) -> None:
        raise NotImplementedError

    def on_persist(self, e: Persist) -> None:
        raise NotImplementedError
