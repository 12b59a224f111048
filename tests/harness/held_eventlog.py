"""An event log whose writer thread is held, for the tests of its bounded queue (test_eventlog, test_eventlines)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pairmq.appliance.eventlog import EventLog, EventSettings


def wait_until(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def held_event_log(directory: Path, queue_max_events: int = 100) -> tuple[EventLog, threading.Event]:
    """A log that has written one event ("first") and whose writer thread then waits in its age check until the
    returned gate is set: whatever is written meanwhile stays in the queue."""
    gate, now = threading.Event(), time.time

    def clock():
        if threading.current_thread().name.startswith("eventlog") and not gate.is_set():
            gate.wait(10)
        return now()

    log = EventLog(directory, "primary", EventSettings(queue_max_events=queue_max_events), clock=clock)
    log.write("first")
    wait_until(lambda: log.written == 1, "the writer to take the first event")
    time.sleep(0.1)  # it is now held in its age check
    return log, gate
