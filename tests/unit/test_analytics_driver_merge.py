"""A small state merged and stored on the driver (analytics/driver_merge.py) is the state Spark merges and stores:
the same rows in every kind, run after run, and the same rows for the reports; the topic hash is Spark's."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql import functions as F

from pairmq.analytics import driver, driver_merge, ingest, summary
from pairmq.analytics.xxhash64 import of_topic
from tests.harness.spark_session import spark  # noqa: F401
from tests.unit.test_analytics_driver import EVENTS
from tests.unit.test_analytics_job import published, stage, write_segment


def test_the_topic_hash_is_spark_s_xxhash64(spark):
    rng = random.Random(7)
    # Every length class of the algorithm (0-3, 4-7, 8-31, 32 and more bytes), and bytes outside ASCII.
    topics = ["", "a", "abc", "abcd", "sensors/1/temp", "x" * 31, "y" * 32, "z" * 33, "é/ü/中文", "q" * 100,
              *("".join(rng.choice("ab/+#é中") for _ in range(rng.randint(0, 70))) for _ in range(200))]
    got = spark.createDataFrame([(t,) for t in topics], "t string").select("t", F.xxhash64("t").alias("h")).collect()
    assert [(r.t, of_topic(r.t)) for r in got] == [(r.t, r.h) for r in got]


def line(event: dict) -> str:
    return json.dumps({k: v for k, v in event.items() if v is not None})


# Two runs: every kind of partial has rows, and messages straddle them (published in one, delivered, acknowledged
# or redelivered in the next).
RUNS = [
    [*(line(e) for e in EVENTS[:20] if not e.get("malformed")), "{broken",
     published("primary", 100.0, 11, "a"), published("primary", 100.5, 12, "b"),
     stage("primary", 100.51, "replicated", [11, 12]), stage("primary", 100.52, "delivered", [11, 12])],
    [*(line(e) for e in EVENTS[20:] if not e.get("malformed")),
     stage("primary", 160.0, "acknowledged", [11, 12]), stage("primary", 161.0, "delivered", [11]),
     published("primary", 171.0, 13, "a")],
]


def stored(out, kind: str) -> list[str]:
    (batch,) = (out / "tables" / "state").iterdir()
    table = ds.dataset(str(batch / kind), format="parquet").to_table()
    # Spark's files hold naive timestamps (INT96, nanoseconds), the driver's UTC microseconds: the same instants.
    utc = pa.schema([pa.field(f.name, pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) else f
                     for f in table.schema])
    return sorted(map(repr, table.cast(utc).to_pylist()))


def test_the_state_merged_on_the_driver_is_the_one_spark_merges_run_after_run(spark, tmp_path):
    """Driver after driver, Spark after Spark, and the driver's merge over a state Spark wrote (a larger state
    earlier, or an --out DIR from before driver_merge.py) all store the same state."""
    logs, on_driver, in_spark, mixed = tmp_path / "logs", tmp_path / "driver", tmp_path / "spark", tmp_path / "mixed"
    for seq, lines in enumerate(RUNS, 1):
        write_segment(logs / "primary", "primary", seq, lines)
        views = [summary.summarize(spark, [logs.as_uri()], out.as_uri(), max_rows=max_rows)
                 for out, max_rows in ((on_driver, driver.MAX_ROWS), (in_spark, 0),
                                       (mixed, 0 if seq == 1 else driver.MAX_ROWS))]
        # Which way each stored its state: one file per kind, or Spark's part files.
        assert [p.name for p in (on_driver / "tables" / "state").glob("*/counts/*.parquet")] == ["part-00000.parquet"]
        # The mixed one: Spark stored the first batch, the driver merged the second over it.
        mixed_files = [p.name for p in (mixed / "tables" / "state").glob("*/counts/*.parquet")]
        if seq == 1:
            assert mixed_files and all(name.endswith(".snappy.parquet") for name in mixed_files)
        else:
            assert mixed_files == ["part-00000.parquet"]
        spark_files = [p.name for p in (in_spark / "tables" / "state").glob("*/counts/*.parquet")]
        assert spark_files and all(name.endswith(".snappy.parquet") for name in spark_files)
        for kind in (*driver_merge.MERGED, "redelivered"):
            assert stored(on_driver, kind) == stored(in_spark, kind) == stored(mixed, kind), (seq, kind)
        for view in views:
            del view["elapsed_s"]
        assert views[0] == views[1] == views[2]
    assert all(stored(on_driver, kind) for kind in driver_merge.MERGED if kind != "messages"), "a kind without rows"
    # Open after both runs (11 and 12 were settled by the second): the comparison reached the merge of open ones.
    open_ids = sorted(eval(r)["msg_id"] for r in stored(on_driver, "messages"))  # noqa: S307 (our own repr)
    assert open_ids == [3, 4, 5, 13]
    # s1 got id 1 thrice (twice from the primary, once from the backup), s got 11 twice: one across the runs.
    assert views[0]["delivery_problems"][-1] == {"what": "redelivered", "reason": "", "messages": 3}


def canonical(rows: list[dict]) -> list[str]:
    """Rows in one order, with each map's keys in one order; types kept (2 is not 2.0)."""
    return sorted(json.dumps({k: [type(v).__name__, v] for k, v in r.items()}, sort_keys=True, default=repr)
                  for r in rows)


def test_a_re_run_reads_a_small_state_on_the_driver_as_spark_collects_it(spark, tmp_path):
    """A state Spark wrote (its timestamps INT96, its maps Spark's), read with pyarrow: the rows Spark collects."""
    logs, out = tmp_path / "logs", tmp_path / "out"
    for seq, lines in enumerate(RUNS, 1):
        write_segment(logs / "primary", "primary", seq, lines)
    summary.summarize(spark, [logs.as_uri()], out.as_uri(), max_rows=0)
    assert not list((out / "tables" / "state").glob("*/counts/part-00000.parquet"))  # Spark's files
    loaded = ingest.load(spark, [logs.as_uri()], out.as_uri(), max_rows=driver.MAX_ROWS)
    assert (loaded.ingested_now, loaded.ingested_before) == (0, 2) and loaded.state is not None
    local = driver_merge.collected(loaded.state, driver.SMALL_EVENTS)
    by_spark = driver.collect(loaded.partials)
    assert set(local) == set(by_spark) == set(driver.READ)
    for kind in driver.READ:
        assert by_spark[kind], f"no {kind} rows: the comparison would prove nothing"
        assert canonical(local[kind]) == canonical(by_spark[kind]), kind
    assert ingest.load(spark, [logs.as_uri()], out.as_uri(), max_rows=10).state is None  # over the bound: Spark's


def test_an_active_segment_keeps_the_reports_in_spark_s_merge(spark, tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "out"
    write_segment(logs / "primary", "primary", 1, RUNS[0])
    (logs / "primary" / "events.jsonl").write_text("".join(f"{x}\n" for x in RUNS[1]))
    loaded = ingest.load(spark, [logs.as_uri()], out.as_uri(), max_rows=driver.MAX_ROWS)
    assert (loaded.ingested_now, loaded.active, loaded.state) == (1, 1, None)
    # The stored state is the driver's all the same.
    assert [p.name for p in (out / "tables" / "state").glob("*/counts/*.parquet")] == ["part-00000.parquet"]
