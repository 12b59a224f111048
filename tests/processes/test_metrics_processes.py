"""`/metrics` from live nodes, read with prometheus_client's own text parser: every name the exposition had
before it moved to prometheus_client is still there, the default `process_*` and `python_*` collectors are,
and the histograms count what happened: publishes acknowledged, spool commits and mate-link round trips on
the active, the failover's detection on the backup that took over after kill -9."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from pairmq.appliance.roles import Role
from pairmq.cli import api
from tests.harness.group import active_group
from tests.harness.http_api import get
from tests.harness.paho_clients import client

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR

# Every sample name /metrics had before prometheus_client rendered it (docs, dashboards and tests use them).
NODE_NAMES = {
    "pairmq_node_info", "pairmq_active", "pairmq_epoch", "pairmq_redundancy_up", "pairmq_uptime_seconds",
    "pairmq_lease_remaining_seconds", "pairmq_peer_seen", "pairmq_peer_heard_age_seconds",
    "pairmq_heartbeats_accepted_total", "pairmq_heartbeats_rejected_total", "pairmq_decisions_total",
    "pairmq_decision_streams", "pairmq_decision_streams_dropped_total"}
ROUTING_NAMES = {
    "pairmq_in_sync", "pairmq_mate_link_up", "pairmq_spool_queued_messages", "pairmq_spool_sessions",
    "pairmq_spool_stored_bytes", "pairmq_spool_pending_ops", "pairmq_messages_received_total",
    "pairmq_messages_sent_total", "pairmq_mqtt_clients", "pairmq_overload_window", "pairmq_overload_load",
    "pairmq_overload_throttled_clients", "pairmq_overload_throttle_events_total", "pairmq_connect_queue_depth",
    "pairmq_connect_busy_refusals_total", "pairmq_config_version", "pairmq_config_sync_in_sync"}
ACTIVE_LINK_NAMES = {"pairmq_mate_link_lag_ops", "pairmq_mate_link_lag_bytes", "pairmq_mate_link_round_trip_seconds"}
HISTOGRAMS = ("pairmq_publish_ack_seconds", "pairmq_spool_commit_seconds", "pairmq_replication_round_trip_seconds",
              "pairmq_failover_detection_seconds")
DEFAULT_COLLECTORS = {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                      "process_start_time_seconds", "python_info", "python_gc_collections_total"}


def scrape(g, role: Role) -> dict:
    """{"families": {name: family}, "samples": {sample name: [(labels, value)]}}, by prometheus_client's parser."""
    answer = get(g.config, f"{api.base_url(g.config, role)}/metrics")
    assert answer.status == 200 and answer.content_type == "text/plain; version=0.0.4; charset=utf-8", answer
    families, samples = {}, {}
    for family in text_string_to_metric_families(answer.text):
        assert family.name not in families, f"{family.name} twice"
        families[family.name] = family
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return {"families": families, "samples": samples}


def caught_up(g) -> bool:
    """The restarted backup answers, holds the active's data, and its catch-up is done."""
    try:
        samples = scrape(g, B)["samples"]
    except OSError:
        return False  # still starting
    running = samples.get("pairmq_resync_running")
    return running is not None and running[0][1] == 0 and samples["pairmq_in_sync"][0][1] == 1


def count(metrics: dict, histogram: str) -> float:
    family = metrics["families"][histogram]
    assert family.type == "histogram", family
    ((labels, n),) = metrics["samples"][histogram + "_count"]
    buckets = metrics["samples"][histogram + "_bucket"]
    assert [lab["le"] for lab, _ in buckets][-1] == "+Inf" and buckets[-1][1] == n  # cumulative, ending at +Inf
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
    return n


def test_metrics_parse_keep_their_names_and_histograms_count_traffic_and_failover(tmp_path):
    with active_group(tmp_path) as g:
        before = scrape(g, P)
        for role, names in ((P, NODE_NAMES | ROUTING_NAMES), (B, NODE_NAMES | ROUTING_NAMES), (M, NODE_NAMES)):
            metrics = before if role is P else scrape(g, role)
            missing = (names | DEFAULT_COLLECTORS | {h + "_count" for h in HISTOGRAMS}) - set(metrics["samples"])
            assert not missing, (role, sorted(missing))
            assert not [n for n in metrics["samples"] if n.endswith("_created")], "no _created series"

        g.kill(B)  # the traffic happens without it: when it comes back, it catches up on the mate link
        sub, got = client("hist-sub", g.address(P), persistent=False)
        sub.subscribe("hist/t", qos=1)
        pub, _ = client("hist-pub", g.address(P), persistent=False)
        for i in range(50):
            pub.publish("hist/t", f"m{i}".encode(), qos=1).wait_for_publish(5)
        for _ in range(50):
            got.get(timeout=5)
        for c in (sub, pub):
            c.disconnect()
            c.loop_stop()
        g.start(B)
        g.wait_for("the backup caught up", lambda: caught_up(g), timeout_s=30)
        # The returned backup may redial once more (a link timed out on a loaded machine): the active reports its
        # link's lag and round trip while one is up, so wait for that, scraped once.
        scraped = {}

        def link_reported() -> bool:
            scraped["after"] = scrape(g, P)
            return not ACTIVE_LINK_NAMES - set(scraped["after"]["samples"])

        g.wait_for("the active's gauges of its link to the returned backup", link_reported)
        after = scraped["after"]
        assert count(after, "pairmq_replication_round_trip_seconds") > 0
        # The standby's catch-up when it came back: done, with its rate and what it made durable.
        standby = scrape(g, B)["samples"]
        assert standby["pairmq_resync_running"][0][1] == 0, standby["pairmq_resync_running"]
        assert standby["pairmq_resync_ops_done"][0][1] >= 50 and standby["pairmq_resync_ops_per_second"][0][1] > 0
        # Each acknowledged QoS 1 PUBLISH is one observation (the SUBSCRIBE of a clean session waits for none).
        assert count(after, "pairmq_publish_ack_seconds") - count(before, "pairmq_publish_ack_seconds") >= 50
        assert after["samples"]["pairmq_publish_ack_seconds_sum"][0][1] > 0
        assert count(after, "pairmq_spool_commit_seconds") > count(before, "pairmq_spool_commit_seconds")
        assert count(after, "pairmq_failover_detection_seconds") == 0  # nobody failed over yet
        assert after["samples"]["process_cpu_seconds_total"][0][1] > 0

        g.kill(P)  # kill -9 of the active: the backup's bid observes how long the primary was silent
        g.wait_for("the backup to serve",
                   lambda: scrape(g, B)["samples"]["pairmq_active"][0][1] == 1, timeout_s=20)
        took_over = scrape(g, B)
        assert count(took_over, "pairmq_failover_detection_seconds") == 1
        detected_s = took_over["samples"]["pairmq_failover_detection_seconds_sum"][0][1]
        lease_s = g.config.timers.lease_ms / 1000
        assert detected_s >= lease_s / 2, detected_s  # a silence of about a lease, not a planned handover's 0
