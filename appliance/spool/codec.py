"""Ops <-> bytes: the form an op takes in the op log and on the mate link.

Rules:
- Layout: one format byte (`FORMAT`), one type byte (`ops.OP_TYPES`), then the
  op's fields in declaration order. Nothing else: no names, no padding.
- Field kinds come from the dataclass annotations:
  int            unsigned LEB128 varint, 0 <= v < 2**63 (SQLite's integer range)
  bool           one byte, 0 or 1
  str            varint byte length, then UTF-8
  bytes          varint byte length, then the bytes
  tuple[int,...] varint count, then that many varints
- Decoding is strict and canonical: an unknown format or type, a truncated or
  over-long varint, a non-minimal varint, a bool other than 0/1, invalid UTF-8,
  a length past the end, or trailing bytes raise `OpCodecError`. So a decoded
  op re-encodes to exactly the bytes it came from.
- A new field or kind needs a new `FORMAT`; type ids are never reused (ops.py).

Theory of operation: this runs once per op on the message path, so each op
type has a straight-line encoder and decoder generated from its layout
(codegen.py) into `_opcodec.py`, checked in and compiled with the hot modules
(docs/build.md); the integers are varints.py's.
"""

from __future__ import annotations

from ._opcodec import FORMAT, decode_op, encode_op
from .varints import MAX_INT, decode_uints, encode_uints

__all__ = ["FORMAT", "MAX_INT", "decode_op", "decode_uints", "encode_op", "encode_uints"]
