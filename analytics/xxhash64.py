"""Spark's `xxhash64` of a string, in Python: the topic hash that a state's per-message rows and latency buckets
are keyed by (partials.topic_hash), for the states merged on the driver (driver_merge.py).

Rules:
- XXH64 (Yann Collet's, little-endian, as Spark's catalyst XXH64) of the
  string's UTF-8 bytes with Spark's seed 42, as a signed 64-bit integer: what
  `F.xxhash64(topic)` gives for a non-null topic. A test compares it with
  Spark's on strings of every length class (0-3, 4-7, 8-31, 32 and more
  bytes) and outside ASCII.
- Called once per distinct topic, never per row: pure Python is slow per call.
"""

from __future__ import annotations

SPARK_SEED = 42
_MASK = (1 << 64) - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _MASK, 31) * _P1) & _MASK


def _merge(h: int, acc: int) -> int:
    return ((h ^ _round(0, acc)) * _P1 + _P4) & _MASK


def xxhash64(data: bytes, seed: int = SPARK_SEED) -> int:
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _MASK, (seed + _P2) & _MASK, seed & _MASK, (seed - _P1) & _MASK]
        while i + 32 <= n:
            for lane in range(4):
                v[lane] = _round(v[lane], int.from_bytes(data[i:i + 8], "little"))
                i += 8
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _MASK
        for acc in v:
            h = _merge(h, acc)
    else:
        h = (seed + _P5) & _MASK
    h = (h + n) & _MASK
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, int.from_bytes(data[i:i + 8], "little")), 27) * _P1 + _P4) & _MASK
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ (int.from_bytes(data[i:i + 4], "little") * _P1 & _MASK), 23) * _P2 + _P3) & _MASK
        i += 4
    while i < n:
        h = (_rotl(h ^ (data[i] * _P5 & _MASK), 11) * _P1) & _MASK
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _MASK
    h ^= h >> 29
    h = (h * _P3) & _MASK
    h ^= h >> 32
    return h - (1 << 64) if h >> 63 else h


def of_topic(topic: str) -> int:
    """partials.topic_hash of a non-null topic."""
    return xxhash64(topic.encode("utf-8"))
