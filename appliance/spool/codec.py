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
type gets a straight-line encoder and decoder generated from its layout at
import (as `dataclasses` does); `generated_source(cls)` shows them.
"""

from __future__ import annotations

import dataclasses

from .errors import OpCodecError
from .ops import OP_TYPES, Op

FORMAT = 1
MAX_INT = (1 << 63) - 1


# The last large value encoded and its bytes, as one tuple (swapped atomically: any thread may encode). Why: a
# read's PUBLISHes share one millisecond timestamp (MessageStored.created_at_ms: 6 varint bytes, a loop each).
_last_varint: tuple[int, bytes] = (-1, b"")


def _put_varint(out: bytearray, value: int) -> None:
    global _last_varint
    if value < 0x80:
        if value < 0:
            raise OpCodecError(f"negative integer {value} cannot be encoded")
        out.append(value)
        return
    last = _last_varint
    if value == last[0]:
        out += last[1]
        return
    if value > MAX_INT:
        raise OpCodecError(f"integer {value} is out of range (at most 2**63 - 1)")
    at, rest = len(out), value
    while rest >= 0x80:
        out.append((rest & 0x7F) | 0x80)
        rest >>= 7
    out.append(rest)
    if len(out) - at > 3:  # timestamps (ids change every time)
        _last_varint = (value, bytes(out[at:]))


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position); strict: at most 9 bytes (exactly 63 bits, so below 2**63), minimal.

    IndexError if truncated.
    """
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = byte & 0x7F
    shift = 7
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            break
        shift += 7
        if shift > 56:
            raise OpCodecError(f"varint at byte {pos} is longer than 9 bytes")
    if byte == 0:
        raise OpCodecError(f"non-minimal varint ending at byte {pos}")
    return value, pos + 1


def _put_uints(out: bytearray, values: tuple[int, ...]) -> None:
    """Append a varint count and the varints (also the queue table's subscription-id column)."""
    if not values:  # a queued message's usual subscription ids: none (a count of 0, one byte)
        out.append(0)
        return
    _put_varint(out, len(values))
    for v in values:
        if type(v) is not int:
            raise OpCodecError(f"tuple item {v!r} is not an int")
        _put_varint(out, v)


def _get_uints(data: bytes, pos: int = 0) -> tuple[tuple[int, ...], int]:
    """(the tuple `_put_uints` wrote at `pos`, next position); IndexError if truncated."""
    count, pos = _varint(data, pos)
    if count > len(data) - pos:
        raise OpCodecError(f"tuple of {count} ints at byte {pos} runs past the end")
    items = []
    for _ in range(count):
        item, pos = _varint(data, pos)
        items.append(item)
    return tuple(items), pos


def encode_uints(values: tuple[int, ...]) -> bytes:
    """A tuple of ints on its own (the queue table's subscription-id column)."""
    out = bytearray()
    _put_uints(out, values)
    return bytes(out)


def decode_uints(data: bytes) -> tuple[int, ...]:
    """The tuple `encode_uints` made; `OpCodecError` for anything else."""
    try:
        values, end = _get_uints(data)
    except IndexError:
        raise OpCodecError("truncated tuple of ints") from None
    if end != len(data):
        raise OpCodecError(f"{len(data) - end} trailing bytes after a tuple of ints")
    return values


def _bad_text(cls: type, name: str) -> OpCodecError:
    return OpCodecError(f"{cls.__name__}.{name} is not valid Unicode text")


# Per kind: (the Python type checked on encode, encode lines, decode lines); `v` is the field's value.
_KINDS: dict[str, tuple[str, list[str], list[str]]] = {
    "int": ("int", ["if 0 <= v < 0x80: out.append(v)",
                    "else: put(out, v)"],
            ["b = data[pos]",
             "if b < 0x80: v = b; pos += 1",
             "else: v, pos = varint(data, pos)"]),
    "bool": ("bool", ["out.append(v)"],
             ["b = data[pos]; pos += 1",
              "if b > 1: raise OpCodecError(f'{NAME}: bool byte {b} at byte {pos - 1}')",
              "v = b == 1"]),
    "str": ("str", ["try: raw = v.encode()",
                    "except UnicodeEncodeError: raise bad_text(cls, FIELD) from None",
                    "n = len(raw)",
                    "if n < 0x80: out.append(n)",
                    "else: put(out, n)",
                    "out += raw"],
            ["n = data[pos]",
             "if n < 0x80: pos += 1",
             "else: n, pos = varint(data, pos)",
             "if n > end - pos: raise OpCodecError(f'{NAME}: field of {n} bytes at byte {pos} runs past the end')",
             "try: v = data[pos:pos + n].decode()",
             "except UnicodeDecodeError:",
             "    raise OpCodecError(f'{NAME}: text at byte {pos} is not valid UTF-8') from None",
             "pos += n"]),
    "bytes": ("bytes", ["n = len(v)",
                        "if n < 0x80: out.append(n)",
                        "else: put(out, n)",
                        "out += v"],
              ["n = data[pos]",
               "if n < 0x80: pos += 1",
               "else: n, pos = varint(data, pos)",
               "if n > end - pos: raise OpCodecError(f'{NAME}: field of {n} bytes at byte {pos} runs past the end')",
               "v = bytes(data[pos:pos + n]); pos += n"]),
    "tuple[int, ...]": ("tuple", ["put_uints(out, v)"], ["v, pos = get_uints(data, pos)"]),
}


def _sources(cls: type) -> tuple[str, str]:
    fields = dataclasses.fields(cls)
    assert all(f.type in _KINDS for f in fields), f"{cls.__name__}: a field kind the codec does not know"
    assert 0 < cls.TYPE < 256
    name = cls.__name__
    enc = [f"def encode_{name}(op):", f"    out = bytearray(({FORMAT}, {cls.TYPE}))"]
    dec = [f"def decode_{name}(data):", "    end = len(data)", "    pos = 2", "    try:"]
    for i, f in enumerate(fields):
        pytype, enc_lines, dec_lines = _KINDS[f.type]
        enc += [f"    v = op.{f.name}",
                f"    if type(v) is not {pytype}:",
                f"        raise OpCodecError(f'{name}.{f.name} is {{type(v).__name__}}, not {pytype}')"]
        enc += ["    " + line.replace("FIELD", repr(f.name)) for line in enc_lines]
        dec += ["        " + line.replace("{NAME}", name) for line in dec_lines] + [f"        f{i} = v"]
    enc.append("    return bytes(out)")
    dec += ["    except IndexError:",
            f"        raise OpCodecError('{name}: truncated at byte ' + str(end)) from None",
            "    if pos != end:",
            f"        raise OpCodecError(f'{name}: {{end - pos}} trailing bytes')",
            f"    return cls({', '.join(f'f{i}' for i in range(len(fields)))})"]
    return "\n".join(enc), "\n".join(dec)


def generated_source(cls: type) -> str:
    """The encoder and decoder generated for op class `cls` (for reading and debugging)."""
    return "\n\n".join(_sources(cls))


def _compile(cls: type) -> tuple:
    namespace = {"cls": cls, "put": _put_varint, "varint": _varint, "put_uints": _put_uints, "get_uints": _get_uints,
                 "bad_text": _bad_text, "OpCodecError": OpCodecError}
    enc_src, dec_src = _sources(cls)
    exec(compile(enc_src, f"<spool codec: encode {cls.__name__}>", "exec"), namespace)
    exec(compile(dec_src, f"<spool codec: decode {cls.__name__}>", "exec"), namespace)
    return namespace[f"encode_{cls.__name__}"], namespace[f"decode_{cls.__name__}"]


_COMPILED = {cls: _compile(cls) for cls in OP_TYPES.values()}
_ENCODERS = {cls: enc for cls, (enc, _) in _COMPILED.items()}
_DECODERS = {type_id: _COMPILED[cls][1] for type_id, cls in OP_TYPES.items()}


def encode_op(op: Op) -> bytes:
    """The op's bytes; `OpCodecError` if it is not an op or a field has the wrong type or range."""
    try:
        encoder = _ENCODERS[type(op)]
    except KeyError:
        raise OpCodecError(f"{type(op).__name__} is not an op") from None
    return encoder(op)


def decode_op(data: bytes) -> Op:
    """The one op `data` encodes; `OpCodecError` for anything else."""
    if len(data) < 2:
        raise OpCodecError(f"op of {len(data)} bytes is too short")
    if data[0] != FORMAT:
        raise OpCodecError(f"op format {data[0]} is unknown (this build reads format {FORMAT})")
    try:
        decoder = _DECODERS[data[1]]
    except KeyError:
        raise OpCodecError(f"op type {data[1]} is unknown") from None
    return decoder(data)
