"""The broker without a node: a BrokerService behind an MqttListener on an event loop thread of its own, reached by
real MQTT clients over loopback sockets. The gate is a FlipGate the test opens and closes."""

from __future__ import annotations

from pairmq.appliance.broker.service import BrokerService
from pairmq.appliance.mqtt.listener import MqttListener
from pairmq.appliance.mqtt.overload import OverloadLimits
from pairmq.appliance.roles import Role
from tests.harness.group import LOOPBACK
from tests.unit.test_mqtt_listener import Events, FlipGate, LoopThread

HOST = LOOPBACK[Role.PRIMARY]


class InProcessBroker:
    def __init__(self, service: BrokerService, overload: OverloadLimits | None = None) -> None:
        """`service`: made but not started (a test may set its hooks first)."""
        self.loop = LoopThread()
        self.gate = FlipGate()
        self.service = service
        self.loop.run(self.service.start())
        kwargs = {"overload": overload} if overload is not None else {}
        self.listener = MqttListener(HOST, 0, self.gate, on_event=Events(), broker=self.service, **kwargs)
        self.loop.run(self.listener.start())
        self.port = self.listener.port

    def call(self, fn, *args):
        """Run `fn(*args)` on the broker's event loop and return its result."""
        return self.loop.call(fn, *args)

    def close(self) -> None:
        try:
            self.loop.run(self.listener.stop())
            self.loop.run(self.service.stop())
        finally:
            self.loop.close()
