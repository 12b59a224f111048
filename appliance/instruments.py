"""The node's Prometheus instruments: one CollectorRegistry per node, its histograms, and the default
`process_*`, `python_*` (platform, gc) collectors. `GET /metrics` renders the registry (appliance/api/metrics.py).

Rules:
- A registry per node, never prometheus_client's global one: a test may run several nodes in one process.
- Histograms are observed where the time is measured already, with seconds (base units), from any thread
  (each instrument takes its own lock). `observe` is the only call on a hot path: one per spool commit,
  one per mate-link pong, one per bid. Acknowledged publishes come a commit's worth at a time, so theirs
  is a `BatchHistogram`, observed once per batch: one lock and no call per value (`observe_n`: the packets of
  one read, which share their read's time).
- Bucket bounds fit what each one measures: a PUBACK waits a commit (and the mate's ack), milliseconds;
  a failover is detected after a lease, around a second.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client import gc_collector, platform_collector, process_collector
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# No `*_created` series: a scrape carries what a dashboard reads, and process_start_time_seconds dates them all.
disable_created_metrics()

_FAST = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_FAILOVER = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class NodeInstruments:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        process_collector.ProcessCollector(registry=self.registry)
        platform_collector.PlatformCollector(registry=self.registry)
        gc_collector.GCCollector(registry=self.registry)
        r = self.registry
        self.publish_ack = BatchHistogram(
            "pairmq_publish_ack_seconds", "A QoS 1/2 PUBLISH (or another packet that waits for durability) read "
            "from its client, to its acknowledgement released: the spool commit and, with a standby, its ack.",
            buckets=_FAST, registry=r)
        self.spool_commit = Histogram(
            "pairmq_spool_commit_seconds", "One spool commit (a batch of ops): write to fdatasync returned.",
            buckets=_FAST, registry=r)
        self.replication_round_trip = Histogram(
            "pairmq_replication_round_trip_seconds", "Mate-link ping to pong on the active (queued behind what "
            "the link carries, so it grows with the replication backlog).", buckets=_FAST, registry=r)
        self.failover_detection = Histogram(
            "pairmq_failover_detection_seconds", "On a standby, at each bid for activity: the time since the "
            "last valid heartbeat from the active it replaces (how long the failure took to notice).",
            buckets=_FAILOVER, registry=r)


class BatchHistogram(Collector):
    """A histogram with prometheus_client's exposition (`_bucket`, `_count`, `_sum`) whose hot caller hands it a
    batch of values at once."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[float], registry: CollectorRegistry) -> None:
        self._name, self._documentation = name, documentation
        bounds = [float(b) for b in buckets]
        if bounds != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be increasing, got {bounds}")
        self._bounds = tuple(bounds) if bounds[-1] == math.inf else (*bounds, math.inf)
        self._counts = [0] * len(self._bounds)  # per bucket, not cumulative
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_many(self, values: Iterable[float]) -> None:
        bounds = self._bounds
        with self._lock:
            counts, total = self._counts, self._sum
            for value in values:
                counts[bisect.bisect_left(bounds, value)] += 1  # "le": a value on a bound counts in that bucket
                total += value  # one by one, as prometheus_client sums: the same float
            self._sum = total

    def observe_n(self, value: float, n: int) -> None:
        """`n` observations of `value`: the packets one read brought, timed from that read together."""
        with self._lock:
            self._counts[bisect.bisect_left(self._bounds, value)] += n
            self._sum += value * n

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, n in zip(self._bounds, counts):
            running += n
            cumulative.append((floatToGoString(bound), running))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=cumulative, sum_value=total)
