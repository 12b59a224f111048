"""appliance/frozen.py: the faster constructor makes the same objects as the dataclass's own, and the classes stay
frozen. Checked against a twin of each class built by `dataclasses` alone (the generated `__init__`)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pairmq.appliance.frozen import fast_init
from pairmq.appliance.spool.ops import OP_TYPES

FAST = list(OP_TYPES.values())


def twin(cls: type) -> type:
    """The same fields on a class whose `__init__` is the one dataclasses generates."""
    fields = [(f.name, f.type, dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING else
               dataclasses.field(default_factory=f.default_factory)
               if f.default_factory is not dataclasses.MISSING else dataclasses.field())
              for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass("Twin" + cls.__name__, fields, frozen=True, slots=True)


values = st.one_of(st.integers(-5, 70000), st.text(max_size=5), st.binary(max_size=5), st.booleans(),
                   st.tuples(st.integers(0, 9)))


@pytest.mark.parametrize("cls", FAST, ids=lambda c: c.__name__)
def test_each_fast_class_is_still_a_frozen_dataclass(cls):
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    assert "fast_init" in cls.__init__.__code__.co_filename, "fast_init not applied"
    required = [f for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    with pytest.raises(TypeError):
        cls(*range(len(required) + len(dataclasses.fields(cls)) + 1))  # too many arguments
    obj = cls(*[1 for _ in required])
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, dataclasses.fields(cls)[0].name, 2)
    assert pickle.loads(pickle.dumps(obj)) == obj
    assert dataclasses.replace(obj) == obj


@pytest.mark.parametrize("cls", FAST, ids=lambda c: c.__name__)
@settings(deadline=None)  # a test of values: a machine loaded by other work must not fail it
@given(data=st.data())
def test_the_same_fields_as_the_generated_init(cls, data):
    fields = dataclasses.fields(cls)
    required = [f for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    n = data.draw(st.integers(len(required), len(fields)))
    args = [data.draw(values) for _ in range(n)]
    ours, theirs = cls(*args), twin(cls)(*args)
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
    by_name = {f.name: data.draw(values) for f in required}
    assert dataclasses.astuple(cls(**by_name)) == dataclasses.astuple(twin(cls)(**by_name))


def test_only_frozen_slotted_classes():
    @dataclasses.dataclass(slots=True)
    class Plain:
        x: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    for cls in (Plain, NoSlots):
        with pytest.raises(AssertionError):
            fast_init(cls)
