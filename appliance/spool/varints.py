"""The op codec's integers: unsigned LEB128 varints and tuples of them.

Rules:
- A varint is 0 <= v < 2**63 (SQLite's integer range), at most 9 bytes, minimal (no trailing 0x00 byte);
  decoding anything else raises `OpCodecError`, a truncated one IndexError (the caller names what was cut).
- A tuple of ints is a varint count, then that many varints (also the queue table's subscription-id column).
"""

from __future__ import annotations

from typing import Final

from .errors import OpCodecError

MAX_INT: Final = (1 << 63) - 1


# The last large value encoded and its bytes, as one tuple (swapped atomically: any thread may encode). Why: a
# read's PUBLISHes share one millisecond timestamp (MessageStored.created_at_ms: 6 varint bytes, a loop each).
_last_varint: tuple[int, bytes] = (-1, b"")


def put_varint(out: bytearray, value: int) -> None:
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


# One bytes object per one-byte varint: the encoders join parts, and most fields are small ints.
_SMALL: Final = tuple(bytes((i,)) for i in range(0x80))


def varint_bytes(value: int) -> bytes:
    """`put_varint`'s bytes on their own: the op encoders' parts (_opcodec.py) are joined once, not appended.
    The groups are packed into one int and written by `int.to_bytes` (compiled: one call, no method lookup)."""
    if value < 0x80:
        if value < 0:
            raise OpCodecError(f"negative integer {value} cannot be encoded")
        return _SMALL[value]
    if value > MAX_INT:
        raise OpCodecError(f"integer {value} is out of range (at most 2**63 - 1)")
    packed, shift = 0, 0
    while value >= 0x80:
        packed |= ((value & 0x7F) | 0x80) << shift
        value >>= 7
        shift += 8
    packed |= value << shift
    return packed.to_bytes(shift // 8 + 1, "little")


def uints_bytes(values: tuple[object, ...]) -> bytes:
    """`put_uints`'s bytes on their own, as parts joined once (a batch op's ids: hundreds of varints)."""
    if type(values) is not tuple:  # compiled code refuses anything else when the op is made; uncompiled, here
        raise OpCodecError(f"a tuple of ints is a {type(values).__name__}, not a tuple")
    if not values:
        return _SMALL[0]
    parts = [varint_bytes(len(values))]
    for item in values:
        if type(item) is not int:
            raise OpCodecError(f"tuple item {item!r} is not an int")
        parts.append(varint_bytes(item))
    return b"".join(parts)


def varint(data: bytes, pos: int) -> tuple[int, int]:
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


def put_uints(out: bytearray, values: tuple[object, ...]) -> None:
    """Append a varint count and the varints; items read as objects, so a wrong one is an `OpCodecError`."""
    if type(values) is not tuple:  # compiled code refuses anything else when the op is made; uncompiled, here
        raise OpCodecError(f"a tuple of ints is a {type(values).__name__}, not a tuple")
    if not values:  # a queued message's usual subscription ids: none (a count of 0, one byte)
        out.append(0)
        return
    put_varint(out, len(values))
    for item in values:
        if type(item) is not int:
            raise OpCodecError(f"tuple item {item!r} is not an int")
        put_varint(out, item)


def get_uints(data: bytes, pos: int = 0) -> tuple[tuple[int, ...], int]:
    """(the tuple `put_uints` wrote at `pos`, next position); IndexError if truncated."""
    count, pos = varint(data, pos)
    if count > len(data) - pos:
        raise OpCodecError(f"tuple of {count} ints at byte {pos} runs past the end")
    items = []
    for _ in range(count):
        item, pos = varint(data, pos)
        items.append(item)
    return tuple(items), pos


def encode_uints(values: tuple[int, ...]) -> bytes:
    """A tuple of ints on its own (the queue table's subscription-id column)."""
    out = bytearray()
    put_uints(out, values)
    return bytes(out)


def decode_uints(data: bytes) -> tuple[int, ...]:
    """The tuple `encode_uints` made; `OpCodecError` for anything else."""
    try:
        values, end = get_uints(data)
    except IndexError:
        raise OpCodecError("truncated tuple of ints") from None
    if end != len(data):
        raise OpCodecError(f"{len(data) - end} trailing bytes after a tuple of ints")
    return values
