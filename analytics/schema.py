"""The event log's schema (docs/events.md) as Spark types: JSON is always read with it, never by inference.

One flat struct holds the union of every event's fields; a field an event
does not carry is null. A line that is not JSON, or lacks `ts`, `node` or
`event`, is malformed: counted and reported, never fatal.
"""

from __future__ import annotations

from pyspark.sql import types as T

SCHEMA_VERSIONS = (1, 2)  # what this job reads; v1 lines (before message events) have the same fields

_FIELDS = [
    ("v", T.IntegerType()), ("ts", T.DoubleType()), ("mono_ms", T.LongType()), ("node", T.StringType()),
    ("event", T.StringType()),
    # redundancy_decision
    ("kind", T.StringType()), ("epoch", T.LongType()), ("reason", T.StringType()), ("core_ms", T.LongType()),
    # message events
    ("msg_id", T.LongType()), ("msg_ids", T.ArrayType(T.LongType())), ("topic", T.StringType()),
    ("qos", T.IntegerType()), ("bytes", T.LongType()), ("client", T.StringType()), ("retain", T.BooleanType()),
    ("created_ms", T.LongType()), ("seq", T.LongType()), ("after_resync", T.BooleanType()),
    # clients, overload, counters
    ("client_id", T.StringType()), ("reason_code", T.IntegerType()), ("return_code", T.IntegerType()),
    ("serving", T.BooleanType()), ("count", T.LongType()), ("max_ms", T.LongType()),
    ("counts", T.MapType(T.StringType(), T.LongType())),
    # publish_outcomes
    ("outcomes", T.ArrayType(T.StructType([
        T.StructField("topic", T.StringType()), T.StructField("qos", T.IntegerType()),
        T.StructField("outcome", T.StringType()), T.StructField("messages", T.LongType())]))),
]

EVENT = T.StructType([T.StructField(name, kind, True) for name, kind in _FIELDS])
CORRUPT = "_corrupt"
RAW = T.StructType([*EVENT.fields, T.StructField(CORRUPT, T.StringType(), True)])
# What the ingested table holds: the event's fields, where it came from, and whether it parsed.
TABLE = T.StructType([*EVENT.fields, T.StructField("segment", T.StringType(), True),
                      T.StructField("malformed", T.BooleanType(), False), T.StructField("day", T.StringType(), True)])
