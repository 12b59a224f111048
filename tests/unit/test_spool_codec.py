"""The spool's op codec and op-log chain, driven directly: no files, no threads."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS, LogEntry, chain, checksum, verify_chain
from pairmq.appliance.spool.codec import FORMAT, MAX_INT, decode_op, decode_uints, encode_op, encode_uints
from pairmq.appliance.spool.errors import ChainError, OpCodecError

KIND_STRATEGIES = {
    "int": st.one_of(st.integers(0, 300), st.integers(0, MAX_INT)),
    "bool": st.booleans(),
    "str": st.text(),
    "bytes": st.binary(max_size=300),
    "tuple[int, ...]": st.lists(st.integers(0, MAX_INT), max_size=5).map(tuple),
}


def op_strategy(cls):
    return st.builds(cls, **{f.name: KIND_STRATEGIES[f.type] for f in dataclasses.fields(cls)})


ANY_OP = st.one_of(*(op_strategy(cls) for cls in o.OP_TYPES.values()))


@pytest.mark.parametrize("cls", list(o.OP_TYPES.values()), ids=lambda c: c.__name__)
def test_every_op_type_round_trips(cls):
    @settings(max_examples=150)
    @given(op_strategy(cls))
    def check(op):
        data = encode_op(op)
        assert data[:2] == bytes((FORMAT, cls.TYPE))
        assert decode_op(data) == op
        assert encode_op(decode_op(data)) == data  # canonical

    check()


@given(ANY_OP, st.data())
def test_every_proper_prefix_and_any_trailing_bytes_are_refused(op, data):
    encoded = encode_op(op)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(OpCodecError):
        decode_op(encoded[:cut])
    with pytest.raises(OpCodecError, match="trailing"):
        decode_op(encoded + data.draw(st.binary(min_size=1, max_size=4)))


@settings(max_examples=2000)
@given(st.binary(max_size=64))
def test_random_bytes_decode_to_a_canonical_op_or_raise_op_codec_error(data):
    try:
        op = decode_op(bytes((FORMAT,)) + data)
    except OpCodecError:
        return
    assert encode_op(op) == bytes((FORMAT,)) + data


def test_the_layout_is_explicit():
    op = o.MessageQueued("c", 300, 1, True, (1, 128))
    assert encode_op(op) == bytes([1, 2, 1]) + b"c" + bytes([0xAC, 0x02, 1, 1, 2, 1, 0x80, 0x01])


@pytest.mark.parametrize("data, why", [
    (b"", "too short"),
    (b"\x01", "too short"),
    (b"\x02\x01", "format 2 is unknown"),
    (b"\x01\x00", "type 0 is unknown"),
    (b"\x01\x63", "type 99 is unknown"),
    (b"\x01\x09\x01\xff", "not valid UTF-8"),  # SessionDeleted with client id b"\xff"
    (b"\x01\x09\x05ab", "runs past the end"),
    (b"\x01\x0b\x01c\x01t\x00", "trailing"),
    (b"\x01\x0c\x01t\x80\x00", "non-minimal varint"),  # RetainedSet, msg_id 0 written in two bytes
    (b"\x01\x0c\x01t" + b"\xff" * 9 + b"\x01", "longer than 9 bytes"),
    (b"\x01\x0c\x01t\x80", "truncated"),
    (b"\x01\x02\x01c\x01\x01\x02\x00", "bool byte 2"),
    (b"\x01\x02\x01c\x01\x01\x01\x05\x01", "runs past the end"),  # a tuple of 5 ints in 1 byte
])
def test_malformed_ops_are_refused_with_a_reason(data, why):
    with pytest.raises(OpCodecError, match=why):
        decode_op(data)


@pytest.mark.parametrize("op, why", [
    (o.SessionDeleted(b"bytes"), "client_id is bytes, not str"),
    (o.RetainedSet("t", -1), "negative"),
    (o.RetainedSet("t", MAX_INT + 1), "out of range"),
    (o.RetainedSet("t", True), "msg_id is bool, not int"),
    (o.MessageQueued("c", 1, 1, 1), "retain is int, not bool"),
    (o.MessageQueued("c", 1, 1, False, [1]), "not tuple"),
    (o.MessageQueued("c", 1, 1, False, ("1",)), "is not an int"),
    (o.SessionDeleted("\ud800"), "not valid Unicode"),
    ("not an op", "str is not an op"),
])
def test_ops_that_cannot_be_encoded_are_refused(op, why):
    with pytest.raises(OpCodecError, match=why):
        encode_op(op)


def test_nine_byte_varints_cover_exactly_the_63_bit_range():
    assert decode_op(encode_op(o.RetainedSet("t", MAX_INT))) == o.RetainedSet("t", MAX_INT)
    assert encode_op(o.RetainedSet("t", MAX_INT))[4:] == b"\xff" * 8 + b"\x7f"


def test_uint_tuples_on_their_own():
    assert decode_uints(encode_uints((0, 1, 1 << 40))) == (0, 1, 1 << 40)
    for bad in (b"", b"\x02\x01", b"\x01\x01\x01"):
        with pytest.raises(OpCodecError):
            decode_uints(bad)


# The chain.

BODIES = [encode_op(o.SessionDeleted(f"c{i}")) for i in range(6)]


def test_chained_entries_verify_and_each_checksum_binds_its_predecessor():
    first = chain(GENESIS, 3, BODIES[:3])
    entries = first + chain(first[-1].point, 5, BODIES[3:])
    assert [(e.epoch, e.seq) for e in entries] == [(3, 1), (3, 2), (3, 3), (5, 4), (5, 5), (5, 6)]
    assert entries[0].checksum == checksum(bytes(16), 3, 1, BODIES[0])
    assert entries[1].checksum == checksum(entries[0].checksum, 3, 2, BODIES[1])
    assert verify_chain(entries) == entries[-1].point
    assert verify_chain(entries[2:], entries[1].point) == entries[-1].point
    assert verify_chain([], entries[1].point) == entries[1].point


def tamper(entries, i, **change):
    return entries[:i] + [entries[i]._replace(**change)] + entries[i + 1:]


@pytest.mark.parametrize("make_bad, why", [
    (lambda es: es[:2] + es[3:], "op 4 follows op 2 \\(op 3 is missing\\)"),
    (lambda es: es[:3] + es[2:], "op 3 repeats or goes back after op 3"),
    (lambda es: tamper(es, 2, body=es[2].body[:-1] + b"x"), "op 3's checksum does not chain"),
    (lambda es: tamper(es, 2, checksum=bytes(16)), "op 3's checksum does not chain"),
    (lambda es: tamper(es, 2, checksum=es[2].checksum[:8]), "op 3's checksum does not chain"),
    (lambda es: tamper(es, 2, epoch=9), "op 3's checksum does not chain"),
    (lambda es: tamper(es, 4, epoch=1), "op 5's epoch 1 is older than op 4's epoch 2"),
])
def test_verify_chain_names_the_first_op_that_does_not_follow(make_bad, why):
    first = chain(GENESIS, 1, BODIES[:3])
    entries = first + chain(first[-1].point, 2, BODIES[3:])
    with pytest.raises(ChainError, match=why) as info:
        verify_chain(make_bad(entries))
    assert info.value.seq == int(why.split()[1].split("'")[0])


def test_a_chain_verified_from_the_wrong_predecessor_is_refused():
    entries = chain(GENESIS, 1, BODIES)
    with pytest.raises(ChainError, match="op 1's checksum"):
        verify_chain(entries, dataclasses.replace(GENESIS, checksum=b"\x01" * 16))
    assert isinstance(entries[0], LogEntry)


@given(st.lists(st.integers(0, (1 << 63) - 1), max_size=20))
def test_a_value_encoded_again_gives_the_same_bytes(values):
    # codec._put_varint keeps the last large value's bytes (a read's PUBLISHes share one timestamp): a repeat, an
    # alternation and a run must all encode as the first time, and decode back.
    from pairmq.appliance.spool.codec import _put_varint, _varint
    for value in [v for v in values for _ in range(2)] + values:
        out = bytearray(b"\x01")
        _put_varint(out, value)
        assert _varint(bytes(out), 1) == (value, len(out))
        fresh = bytearray(b"\x01")
        rest = value
        while rest >= 0x80:
            fresh.append((rest & 0x7F) | 0x80)
            rest >>= 7
        fresh.append(rest)
        assert out == fresh
