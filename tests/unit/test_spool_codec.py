"""The spool's op codec and the op log's chain of commits, driven directly: no files, no threads."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.appliance.spool import codegen
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.chain import GENESIS, Commit, checksum
from pairmq.appliance.spool.records import COMMIT_BYTES, make_commit, op_bodies, verify_chain
from pairmq.appliance.spool.codec import FORMAT, MAX_INT, decode_op, decode_uints, encode_op, encode_uints
from pairmq.appliance.spool.errors import ChainError, OpCodecError

KIND_STRATEGIES = {
    "int": st.one_of(st.integers(0, 300), st.integers(0, MAX_INT)),
    "bool": st.booleans(),
    "str": st.text(),
    "bytes": st.binary(max_size=300),
    "tuple[int, ...]": st.lists(st.integers(0, MAX_INT), max_size=5).map(tuple),
}


TYPE_IDS = {cls: type_id for type_id, cls in o.OP_TYPES.items()}


def op_strategy(cls):
    return st.builds(cls, **{name: KIND_STRATEGIES[kind] for name, kind in codegen.field_kinds(cls)})


ANY_OP = st.one_of(*(op_strategy(cls) for cls in o.OP_TYPES.values()))


@pytest.mark.parametrize("cls", list(o.OP_TYPES.values()), ids=lambda c: c.__name__)
def test_every_op_type_round_trips(cls):
    @settings(max_examples=150)
    @given(op_strategy(cls))
    def check(op):
        data = encode_op(op)
        assert data[:2] == bytes((FORMAT, TYPE_IDS[cls]))
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
    (o.RetainedSet("t", -1), "negative"),
    (o.RetainedSet("t", MAX_INT + 1), "out of range"),
    (o.MessageQueued("c", 1, 1, False, ("1",)), "is not an int"),  # a tuple's items are not checked when made
    (o.SessionDeleted("\ud800"), "not valid Unicode"),
    ("not an op", "str is not an op"),
])
def test_ops_that_cannot_be_encoded_are_refused(op, why):
    with pytest.raises(OpCodecError, match=why):
        encode_op(op)


@pytest.mark.parametrize("cls, args", [
    (o.SessionDeleted, (b"bytes",)),
    (o.MessageAcked, ("c", "7")),
    (o.MessageQueued, ("c", 1, 1, False, [1])),
    (o.MessageStored, (1, "t", "not bytes", 1, False, b"", 0, "p", 0)),
])
def test_an_op_with_a_field_of_the_wrong_type_is_never_written(cls, args):
    # Compiled, the op's constructor refuses it (mypy does before that); uncompiled, encoding it fails.
    with pytest.raises((TypeError, AttributeError, OpCodecError)):
        encode_op(cls(*args))


def test_a_bool_field_is_written_as_a_bool_byte_whatever_it_holds():
    # Only uncompiled can a bool field hold another value; written as 1 or 0, its bytes still decode.
    try:
        op = o.MessageQueued("c", 1, 1, 5)
    except TypeError:  # compiled: refused when made
        return
    assert decode_op(encode_op(op)) == o.MessageQueued("c", 1, 1, True)


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


def chained(groups, epoch_of=lambda i: 1):
    out, prev = [], GENESIS
    for i, bodies in enumerate(groups):
        out.append(make_commit(prev, epoch_of(i), bodies))
        prev = out[-1].point
    return out


def test_chained_commits_verify_and_each_checksum_binds_its_predecessor():
    commits = chained([BODIES[:2], BODIES[2:3], BODIES[3:]], epoch_of=lambda i: 3 if i < 2 else 5)
    assert [(c.epoch, c.first_seq, c.last_seq) for c in commits] == [(3, 1, 2), (3, 3, 3), (5, 4, 6)]
    records = memoryview(commits[0].data)[:-COMMIT_BYTES]
    assert commits[0].checksum == checksum(bytes(16), 3, 2, 2, records)
    assert commits[1].checksum == checksum(commits[0].checksum, 3, 3, 1, memoryview(commits[1].data)[:-COMMIT_BYTES])
    assert verify_chain(commits, GENESIS) == commits[-1].point
    assert verify_chain(commits[1:], commits[0].point) == commits[-1].point
    assert verify_chain([], commits[1].point) == commits[1].point
    assert [b for c in commits for b in op_bodies(c)] == BODIES


def tamper(commits, i, **change):
    return commits[:i] + [commits[i]._replace(**change)] + commits[i + 1:]


@pytest.mark.parametrize("make_bad, why", [
    (lambda cs: cs[:1] + cs[2:], "ops 4..6 follow op 2 \\(op 3 is missing\\)"),
    (lambda cs: cs[:2] + cs[1:], "ops 3..3 repeat or go back after op 3"),
    (lambda cs: tamper(cs, 1, data=cs[1].data.replace(BODIES[2], BODIES[2][:-1] + b"x")),
     "ops 3..3: their checksum does not chain"),
    (lambda cs: tamper(cs, 1, checksum=bytes(16)), "ops 3..3: their checksum does not chain"),
    (lambda cs: tamper(cs, 1, epoch=2), "ops 3..3: their checksum does not chain"),
    (lambda cs: tamper(cs, 2, epoch=0), "ops 4..6 have epoch 0, older than op 3's epoch 1"),
    (lambda cs: tamper(cs, 1, ops=0, last_seq=2), "a commit of 0 ops"),
])
def test_verify_chain_names_the_first_commit_that_does_not_follow(make_bad, why):
    commits = chained([BODIES[:2], BODIES[2:3], BODIES[3:]])
    with pytest.raises(ChainError, match=why) as info:
        verify_chain(make_bad(commits), GENESIS)
    assert info.value.seq in (2, 3, 6)


def test_a_chain_verified_from_the_wrong_predecessor_is_refused():
    commits = chained([BODIES])
    with pytest.raises(ChainError, match="ops 1..6: their checksum"):
        verify_chain(commits, dataclasses.replace(GENESIS, checksum=b"\x01" * 16))
    assert isinstance(commits[0], Commit)


@given(st.lists(st.integers(0, (1 << 63) - 1), max_size=20))
def test_a_value_encoded_again_gives_the_same_bytes(values):
    # varints.put_varint keeps the last large value's bytes (a read's PUBLISHes share one timestamp): a repeat, an
    # alternation and a run must all encode as the first time, and decode back.
    from pairmq.appliance.spool.varints import put_varint, varint
    for value in [v for v in values for _ in range(2)] + values:
        out = bytearray(b"\x01")
        put_varint(out, value)
        assert varint(bytes(out), 1) == (value, len(out))
        fresh = bytearray(b"\x01")
        rest = value
        while rest >= 0x80:
            fresh.append((rest & 0x7F) | 0x80)
            rest >>= 7
        fresh.append(rest)
        assert out == fresh


def test_the_checked_in_op_codec_is_what_the_generator_writes_from_the_op_classes():
    import pathlib

    from pairmq.appliance.spool import codegen
    checked_in = pathlib.Path(codegen.__file__).with_name("_opcodec.py").read_text()
    assert checked_in == codegen.module_source(), \
        "rewrite it: python -m pairmq.appliance.spool.codegen > appliance/spool/_opcodec.py"
    for cls in o.OP_TYPES.values():  # each op type has its own encoder and decoder in it
        assert codegen.generated_source(cls) in checked_in


def test_a_tuple_item_of_the_wrong_type_or_a_non_op_is_an_op_codec_error_not_a_type_error():
    with pytest.raises(OpCodecError, match="tuple item '1' is not an int"):
        encode_op(o.MessagesAcked("c", ("1",)))
    with pytest.raises(OpCodecError, match="str is not an op"):
        encode_op("MessageAcked")


@pytest.mark.parametrize("op, message", [
    (o.MessageRouted(1, "t", b"", 1, False, b"", 0, "p", 0, "c", 3, False), "MessageRouted.queue_qos 3 is outside 0..2"),
    (o.Subscribed("c", "f", 1, retain_handling=3), "Subscribed.retain_handling 3 is outside 0..2"),
    (o.SessionOpened("c", 6, 0, 0), "SessionOpened.protocol_version 6 is outside 3..5"),
    (o.InboundQos2Received("c", 0), "InboundQos2Received.packet_id 0 is outside 1..65535"),
    (o.MessagesInflight("c", (1, 2), (1,)), "has 2 msg_ids but 1 packet_ids"),
    (o.MessagesInflight("c", (1,), (65536,)), "item 65536 is outside 1..65535"),
    (o.MessagesAcked("c", tuple(range(65536))), "MessagesAcked of 65536 messages"),
])
def test_an_op_outside_its_domains_is_a_value_error(op, message):
    from pairmq.appliance.spool.domains import check_op
    with pytest.raises(ValueError, match=message):
        check_op(op)


def test_ops_inside_their_domains_pass_the_checks():
    from pairmq.appliance.spool.domains import check_op
    for op in (o.MessageRouted(1, "t", b"", 2, False, b"", 0, "p", 0, "c", 0, False), o.SessionOpened("c", 3, 0, 0),
               o.MessagesInflight("c", (1, 2), (1, 65535)), o.MessagesAcked("c", tuple(range(65535))),
               o.Subscribed("c", "f", 0, retain_handling=2), o.SessionDeleted("c")):
        check_op(op)
