"""The spool's ops (appliance/spool/ops.py) with explicit constructors and `Final` fields, compiled: the same type
ids and the same bytes as before, what their users rely on from a dataclass, and immutable (by mypy; compiled,
also at run time)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

from pairmq.appliance.spool import codegen
from pairmq.appliance.spool import ops as o
from pairmq.appliance.spool.codec import decode_op, encode_op

REPO = pathlib.Path(__file__).resolve().parents[2]
PURE = os.environ.get("PAIRMQ_PURE_PYTHON") == "1"

# Part of the on-disk and on-wire format: a change here is a new format, never an edit.
TYPE_IDS = {1: "MessageStored", 2: "MessageQueued", 3: "MessageInflight", 4: "MessagePubrecReceived",
            5: "MessageAcked", 6: "MessageDropped", 7: "SessionOpened", 8: "SessionDisconnected", 9: "SessionDeleted",
            10: "Subscribed", 11: "Unsubscribed", 12: "RetainedSet", 13: "RetainedCleared",
            14: "InboundQos2Received", 15: "InboundQos2Released", 16: "WillSet", 17: "WillCleared",
            18: "MessageIdSeen", 19: "MessagesInflight", 20: "MessagesAcked", 21: "SessionOwned", 22: "MessageRouted"}

# Each op with every field set from SAMPLE by its kind, as the op codec wrote it when the ops were frozen dataclasses
# with class-level type ids (the bytes spools and mate links hold).
SAMPLE = {"int": 300, "bool": True, "str": "é/x", "bytes": b"\x00\xff", "tuple[int, ...]": (1, 128)}
WRITTEN = {
    "MessageStored": "0101ac0204c3a92f780200ffac02010200ffac0204c3a92f78ac02",
    "MessageQueued": "010204c3a92f78ac02ac020102018001",
    "MessageInflight": "010304c3a92f78ac02ac02",
    "MessagePubrecReceived": "010404c3a92f78ac02",
    "MessageAcked": "010504c3a92f78ac02",
    "MessageDropped": "010604c3a92f78ac0204c3a92f78",
    "SessionOpened": "010704c3a92f78ac02ac02ac02",
    "SessionDisconnected": "010804c3a92f78ac02ac02",
    "SessionDeleted": "010904c3a92f78",
    "Subscribed": "010a04c3a92f7804c3a92f78ac020101ac02ac02",
    "Unsubscribed": "010b04c3a92f7804c3a92f78",
    "RetainedSet": "010c04c3a92f78ac02",
    "RetainedCleared": "010d04c3a92f78",
    "InboundQos2Received": "010e04c3a92f78ac02",
    "InboundQos2Released": "010f04c3a92f78ac02",
    "WillSet": "011004c3a92f78ac02ac02",
    "WillCleared": "011104c3a92f78",
    "MessageIdSeen": "011204c3a92f7804c3a92f78ac02",
    "MessagesInflight": "011304c3a92f780201800102018001",
    "MessagesAcked": "011404c3a92f7802018001",
    "SessionOwned": "011504c3a92f7804c3a92f78",
    "MessageRouted": "0116ac0204c3a92f780200ffac02010200ffac0204c3a92f78ac0204c3a92f78ac020102018001",
}
OPS = list(o.OP_TYPES.values())


def sample(cls: type) -> tuple[dict[str, object], object]:
    values = {name: SAMPLE[kind] for name, kind in codegen.field_kinds(cls)}
    return values, cls(**values)


def test_the_type_ids_are_the_format_s():
    assert {type_id: cls.__name__ for type_id, cls in o.OP_TYPES.items()} == TYPE_IDS
    assert set(o.OP_TYPES.values()) == set(o.Op.__args__)


@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
def test_each_op_is_written_as_before_and_read_back(cls):
    _, op = sample(cls)
    data = encode_op(op)
    assert data.hex() == WRITTEN[cls.__name__]
    assert decode_op(bytes.fromhex(WRITTEN[cls.__name__])) == op


@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
def test_the_dataclass_fields_are_the_constructor_parameters(cls):
    values, by_name = sample(cls)
    assert [f.name for f in dataclasses.fields(cls)] == list(values)
    by_position = cls(*values.values())
    assert by_name == by_position and hash(by_name) == hash(by_position)
    assert [getattr(by_name, name) for name in values] == list(values.values())
    assert dataclasses.replace(by_name) == by_name
    assert repr(by_name).startswith(f"{cls.__name__}({next(iter(values))}=")
    with pytest.raises(TypeError):
        cls(*values.values(), 1)  # one argument too many


def test_defaults():
    assert o.MessageQueued("c", 1, 1, False) == o.MessageQueued("c", 1, 1, False, ())
    assert o.Subscribed("c", "f", 1) == o.Subscribed("c", "f", 1, False, False, 0, 0)
    routed = o.MessageRouted(1, "t", b"p", 1, False, b"", 0, "pub", 5, "c", 1, True)
    assert routed.subscription_ids == ()
    assert routed.stored() == o.MessageStored(1, "t", b"p", 1, False, b"", 0, "pub", 5)


def test_assigning_a_field_is_a_type_error(tmp_path):
    """mypy --strict refuses it in any module that is type-checked (the compiled ones are), as it refused
    assignment to a frozen dataclass's field."""
    stage = REPO / "build" / "mypy-src"
    (stage / "pairmq").mkdir(parents=True, exist_ok=True)
    link = stage / "pairmq" / "appliance"
    if not link.is_symlink():
        link.symlink_to(REPO / "appliance", target_is_directory=True)
    snippet = tmp_path / "mutates.py"
    snippet.write_text("from pairmq.appliance.spool.ops import MessageAcked\n"
                       "op = MessageAcked('c', 1)\n"
                       "op.msg_id = 2\n")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(REPO / "build" / "mypy-cache"), str(snippet)],
        cwd=stage, env={**os.environ, "MYPYPATH": str(stage)}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'Cannot assign to final attribute "msg_id"' in result.stdout


@pytest.mark.compiled
def test_compiled_an_op_refuses_assignment_at_run_time():
    op = o.MessageAcked("c", 1)
    with pytest.raises(AttributeError, match="not writable"):
        op.msg_id = 2  # type: ignore[misc]
    assert op.msg_id == 1
