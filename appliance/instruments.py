"""The node's Prometheus instruments: one CollectorRegistry per node, its histograms, and the default
`process_*`, `python_*` (platform, gc) collectors. `GET /metrics` renders the registry (appliance/api/metrics.py).

Rules:
- A registry per node, never prometheus_client's global one: a test may run several nodes in one process.
- Histograms are observed where the time is measured already, with seconds (base units), from any thread
  (prometheus_client's instruments take their own lock). `observe` is the only call on a hot path: one
  per acknowledged publish, one per spool commit, one per mate-link pong, one per bid.
- Bucket bounds fit what each one measures: a PUBACK waits a commit (and the mate's ack), milliseconds;
  a failover is detected after a lease, around a second.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics
from prometheus_client import gc_collector, platform_collector, process_collector

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
        self.publish_ack = Histogram(
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
