"""`GET /metrics`: the node's numbers in the Prometheus text exposition format (version 0.0.4),
rendered by prometheus_client from the node's own registry (appliance/instruments.py: the histograms and
the `process_*`, `python_*` collectors) and the numbers below, read at scrape time.

Rules:
- Every metric of ours is named `pairmq_*`; prometheus_client writes one HELP and one TYPE line each.
- Counters only grow within a node process (`_total`); Prometheus computes rates from them and
  treats a restart as a counter reset. Gauges are the value now. Units are base units in the name
  (`_seconds`, `_bytes`).
- Each node reports itself: `pairmq_active{role="backup"}` is 1 while that node serves; scrape all three.
- A metric that does not apply to this node (the monitor routes no messages) is left out, never 0.
- Read on the event loop; the quorum core's numbers are read under the heartbeat lock in one go.

`status_document` is the same numbers as JSON for the status page (`GET /api/v1/status`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..quorum.auth import REASONS
from .ports import ApiPorts, RoutingPorts

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes


@dataclass(slots=True)
class Metric:
    name: str
    kind: str  # "gauge" or "counter"
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> "Metric":
        self.samples.append((labels, value))
        return self

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        """This metric as prometheus_client's family (a counter's name loses `_total`: the library adds it)."""
        if self.kind == "counter":
            fam = CounterMetricFamily(self.name.removesuffix("_total"), self.help, labels=self._label_names())
        else:
            fam = GaugeMetricFamily(self.name, self.help, labels=self._label_names())
        for labels, value in self.samples:
            fam.add_metric(list(labels.values()), float(value))
        return fam

    def _label_names(self) -> list[str]:
        return list(self.samples[0][0]) if self.samples else []


class _Scrape:
    """What one scrape renders: the numbers read now, then the node's registry (histograms, process, python)."""

    def __init__(self, metrics: list[Metric], registry) -> None:
        self._metrics, self._registry = metrics, registry

    def collect(self):
        for m in self._metrics:
            yield m.family()
        if self._registry is not None:
            yield from self._registry.collect()


def exposition(ports: ApiPorts) -> bytes:
    """The `/metrics` body of this node now."""
    return render(collect(ports), ports.instruments.registry if ports.instruments is not None else None)


def render(metrics: list[Metric], registry=None) -> bytes:
    """`metrics`, then what `registry` (a CollectorRegistry) collects, in the text format 0.0.4."""
    return generate_latest(_Scrape(metrics, registry))


def collect(ports: ApiPorts, view: dict | None = None) -> list[Metric]:
    """Every metric of this node now; `view` is its redundancy view if the caller has one already."""
    view = view if view is not None else ports.redundancy_view()  # takes the heartbeat lock once
    role = ports.role.value
    g, c = _gauge, _counter
    metrics = [
        g("pairmq_node_info", "This node: its role, address and group (always 1).").add(
            1, role=role, address=ports.address, group=ports.config.name),
        g("pairmq_active", "1 while this node holds activity and serves MQTT clients, else 0.").add(
            int(view["serving"]), role=role),
        g("pairmq_epoch", "The highest epoch this node knows (every activity period has a higher one).").add(
            view["epoch"]),
        g("pairmq_redundancy_up", "1 when this node's redundancy status is Up, else 0.").add(
            int(view["redundancy_status"] == "Up")),
        g("pairmq_uptime_seconds", "Seconds since this node process started.").add(view["uptime_ms"] / 1000),
        g("pairmq_lease_remaining_seconds", "What is left of the active's lease (0 when not serving).").add(
            view["lease_remaining_ms"] / 1000),
    ]
    seen = g("pairmq_peer_seen", "1 while this node sees the peer (mutual heartbeat visibility), else 0.")
    heard = g("pairmq_peer_heard_age_seconds", "Seconds since a valid heartbeat from the peer arrived.")
    for peer in view["peers"]:
        seen.add(int(peer["seen"]), peer=peer["role"])
        if peer["heard_ms_ago"] is not None:
            heard.add(peer["heard_ms_ago"] / 1000, peer=peer["role"])
    metrics += [seen, heard,
                c("pairmq_heartbeats_accepted_total", "Heartbeats that passed every check.").add(
                    view["accepted_heartbeats"])]
    rejected = c("pairmq_heartbeats_rejected_total", "Heartbeats refused, by the first check they failed.")
    for reason in REASONS:
        rejected.add(view["rejected_heartbeats"].get(reason, 0), reason=reason)
    metrics += [rejected, c("pairmq_decisions_total", "Redundancy decisions this node process made.").add(
        ports.decisions.seq),
        g("pairmq_decision_streams", "Open decision streams (GET /api/v1/decisions/stream).").add(
            ports.decisions.streams),
        c("pairmq_decision_streams_dropped_total", "Decision streams dropped because the client read too slowly.").add(
            ports.decisions.dropped)]
    if view["in_sync"] is not None:
        metrics.append(g("pairmq_in_sync", "1 while this routing node holds the active's data (or is it).").add(
            int(view["in_sync"])))
    if view.get("resync") is not None:
        metrics += _resync(view["resync"])
    if ports.routing is not None:
        metrics += _routing(ports.routing)
    return metrics


def _resync(resync: dict) -> list[Metric]:
    """On a standby: its latest mate-link catch-up (the redundancy view's `resync`), a rate and what is left."""
    g = _gauge
    metrics = [
        g("pairmq_resync_running", "1 while the standby's mate-link catch-up runs, 0 once the latest one is done.").add(
            int(resync["state"] == "running")),
        g("pairmq_resync_ops_per_second", "The latest catch-up's rate: ops made durable per second over it.").add(
            resync["ops_per_s"]),
        g("pairmq_resync_bytes_per_second", "The latest catch-up's rate in bytes of message bodies per second.").add(
            resync["bytes_per_s"]),
        g("pairmq_resync_ops_done", "Ops the latest catch-up made durable so far.").add(resync["ops_done"]),
    ]
    if resync["ops_to_go"] is not None:
        metrics.append(g("pairmq_resync_ops_to_go", "Ops the running catch-up has still to make durable.").add(
            resync["ops_to_go"]))
    return metrics


def _routing(routing: RoutingPorts) -> list[Metric]:
    g, c = _gauge, _counter
    metrics = _mate_link(routing)
    spool = routing.spool_view()
    metrics += [
        g("pairmq_spool_queued_messages", "QoS 1/2 messages queued for sessions in the spool.").add(
            spool["queued_messages"]),
        g("pairmq_spool_sessions", "Sessions held (connected or persistent).").add(spool["sessions"]),
        g("pairmq_spool_stored_bytes", "Bytes of message bodies the spool holds.").add(spool["stored_bytes"]),
        g("pairmq_spool_pending_ops", "Ops waiting for the spool writer's next commit.").add(
            spool["writer"]["pending_ops"]),
    ]
    running = routing.listeners()
    listeners = [x for x, _ in running]
    stats = [x.stats() for x in listeners]
    metrics += [
        c("pairmq_messages_received_total", "PUBLISH packets received from clients.").add(
            sum(s["messages_in"] for s in stats)),
        c("pairmq_messages_sent_total", "PUBLISH packets sent to clients.").add(sum(s["messages_out"] for s in stats)),
        g("pairmq_mqtt_clients", "Connected MQTT clients.").add(sum(x.client_count for x in listeners)),
    ]
    if running and not running[0][1]:  # the plain listener comes first; its numbers are the overload policy's
        s = stats[0]
        metrics += [
            g("pairmq_overload_window", "Each client's in-flight window now (100 when idle, towards 1 under load).").add(
                s["window"]),
            g("pairmq_overload_load", "The overload policy's load estimate (0 idle, 1 and more overloaded).").add(
                s["load"]),
            g("pairmq_overload_throttled_clients", "Clients whose sockets are not read now (full window).").add(
                s["throttled_clients"]),
            c("pairmq_overload_throttle_events_total", "Times a client's socket stopped being read.").add(
                s["throttle_events"]),
            g("pairmq_connect_queue_depth", "CONNECTs waiting in the bounded CONNECT queue.").add(s["connect_queue"]),
            c("pairmq_connect_busy_refusals_total", "CONNECTs refused with 0x89 server busy (queue full).").add(
                s["busy_refusals"]),
        ]
    sync = routing.configuration.sync
    metrics += [
        g("pairmq_config_version", "The version of the replicated configuration in force.").add(
            routing.configuration.store.head.version),
        g("pairmq_config_sync_in_sync", "1 when config-sync's status is In-Sync, else 0.").add(
            int(sync.status().value == "In-Sync")),
    ]
    return metrics


def _mate_link(routing: RoutingPorts) -> list[Metric]:
    """On the active: how far the standby is behind. Elsewhere only whether a link is up."""
    g = _gauge
    up, link = routing.mate_link()
    metrics = [g("pairmq_mate_link_up", "1 while a mate link is established (as the active or the standby).").add(
        int(up))]
    if link is not None:
        metrics += [
            g("pairmq_mate_link_lag_ops", "Ops the active shipped or holds that the standby has not acknowledged.").add(
                max(0, link.head.seq - link.acked_seq)),
            g("pairmq_mate_link_lag_bytes", "Bytes of shipped ops the standby has not acknowledged.").add(
                link.unacked_bytes),
        ]
        if link.round_trip_ms is not None:
            metrics.append(g("pairmq_mate_link_round_trip_seconds", "The mate link's latest ping round trip.").add(
                link.round_trip_ms / 1000))
    return metrics


def _gauge(name: str, text: str) -> Metric:
    return Metric(name, "gauge", text)


def _counter(name: str, text: str) -> Metric:
    return Metric(name, "counter", text)


def status_document(ports: ApiPorts) -> dict:
    """The status page's view of one node: the redundancy view's headline and every metric by name."""
    view = ports.redundancy_view()
    values: dict[str, object] = {}
    for m in collect(ports, view):
        if len(m.samples) == 1 and not (m.samples[0][0].keys() - {"role"}):
            values[m.name] = m.samples[0][1]
        else:
            values[m.name] = {next(iter(labels.values()), ""): v for labels, v in m.samples}
    config_sync = None
    if ports.routing is not None:
        configuration = ports.routing.configuration
        config_sync = {"status": configuration.sync.status().value, "version": configuration.store.head.version}
    keys = ("role", "address", "group", "activity", "serving", "epoch", "active_role", "redundancy_status",
            "in_sync", "peers", "uptime_ms", "resync")
    return {"schema": 1, **{k: view[k] for k in keys}, "config_sync": config_sync,
            "decisions": view["decisions"][-10:], "metrics": values}
