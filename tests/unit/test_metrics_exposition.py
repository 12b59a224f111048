"""/metrics without a node: our numbers become prometheus_client families (names, types, label escaping),
and each node's instruments live in a registry of their own, so several nodes can share a process."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from pairmq.appliance.api.metrics import Metric, render
from pairmq.appliance.instruments import BatchHistogram, NodeInstruments


def parse(text: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def test_gauges_and_counters_keep_their_names_and_escape_labels():
    hostile = 'a "quoted"\\ label\nwith a newline'
    text = render([Metric("pairmq_x_total", "counter", "Things.\nCounted.").add(3, reason=hostile),
                   Metric("pairmq_y", "gauge", "A value.").add(1.5),
                   Metric("pairmq_empty", "gauge", "Nothing here.")])
    lines = text.decode().splitlines()
    assert "# TYPE pairmq_x_total counter" in lines and "# HELP pairmq_x_total Things.\\nCounted." in lines
    families = parse(text)
    (sample,) = families["pairmq_x"].samples
    assert sample.name == "pairmq_x_total" and sample.value == 3 and sample.labels == {"reason": hostile}
    assert families["pairmq_y"].type == "gauge" and families["pairmq_y"].samples[0].value == 1.5
    assert families["pairmq_empty"].samples == []


def test_each_node_has_its_own_registry_with_histograms_and_default_collectors():
    first, second = NodeInstruments(), NodeInstruments()  # a second registration in one registry would raise
    first.publish_ack.observe(0.003)
    first.publish_ack.observe(0.3)
    first.failover_detection.observe(0.6)
    a, b = parse(render([], first.registry)), parse(render([], second.registry))
    count = {s.name: s.value for s in a["pairmq_publish_ack_seconds"].samples if not s.name.endswith("_bucket")}
    assert count == {"pairmq_publish_ack_seconds_count": 2, "pairmq_publish_ack_seconds_sum": 0.303}
    buckets = {s.labels["le"]: s.value for s in a["pairmq_publish_ack_seconds"].samples if s.name.endswith("_bucket")}
    assert buckets["0.002"] == 0 and buckets["0.005"] == 1 and buckets["0.2"] == 1 and buckets["0.5"] == 2
    assert buckets["+Inf"] == 2
    assert [s.value for s in b["pairmq_publish_ack_seconds"].samples if s.name.endswith("_count")] == [0]
    for families in (a, b):
        assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info",
                "python_gc_collections"} <= set(families)
        assert not [s for f in families.values() for s in f.samples if s.name.endswith("_created")]


def test_a_batch_histogram_renders_what_prometheus_clients_histogram_renders_for_the_same_values():
    values = [0.0001, 0.0002, 0.00020001, 0.001, 0.002, 0.0049, 0.05, 1.0, 4.99, 5.0, 7.5, 1e9]
    buckets = (0.0002, 0.001, 0.005, 1.0, 5.0)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batched = BatchHistogram("pairmq_t_seconds", "A test.", buckets, ours)
    single = Histogram("pairmq_t_seconds", "A test.", buckets=buckets, registry=theirs)
    batched.observe_many(values[:5])
    batched.observe_many([])
    batched.observe_many(values[5:-1])
    batched.observe(values[-1])
    for value in values:
        single.observe(value)
    a, b = parse(render([], ours))["pairmq_t_seconds"], parse(render([], theirs))["pairmq_t_seconds"]
    assert a.type == b.type == "histogram"
    assert [(s.name, s.labels, s.value) for s in a.samples] == [(s.name, s.labels, s.value) for s in b.samples]
    assert {s.labels["le"]: s.value for s in a.samples if s.name.endswith("_bucket")}["0.0002"] == 2  # "le"


def test_a_batch_histogram_refuses_buckets_out_of_order():
    with pytest.raises(ValueError, match="increasing"):
        BatchHistogram("pairmq_u_seconds", "A test.", (0.1, 0.01), CollectorRegistry())
