"""A faster `__init__` for frozen, slotted dataclasses made once per message.

Rules:
- Only the constructor changes: the class stays a frozen dataclass (assignment
  raises FrozenInstanceError, eq/hash/repr/replace/pickle as dataclasses make
  them), with the same signature, defaults and default factories, and its
  `__post_init__` still runs.
- Why: a frozen dataclass's generated `__init__` sets each field through
  `object.__setattr__`, looked up per field, which the durable QoS 1 path pays
  for ~10 objects per message (the PUBLISH and PUBACK packets, the spool ops,
  the broker's effects); calling each slot's own descriptor costs half of that.
- Use it on slotted classes only (there is no descriptor to call otherwise),
  applied after (above) `@dataclass`.
"""

from __future__ import annotations

import dataclasses

_MISSING = object()


def fast_init(cls: type) -> type:
    """Replace the frozen, slotted dataclass `cls`'s `__init__` by one that sets the slots directly."""
    fields = dataclasses.fields(cls)  # ClassVars are not fields; none of ours has an InitVar or a kw_only field
    assert cls.__dataclass_params__.frozen and "__slots__" in cls.__dict__, f"{cls.__name__}: frozen and slotted only"
    assert all(f.init and not f.kw_only for f in fields), f"{cls.__name__}: a field fast_init does not handle"
    namespace: dict[str, object] = {"_MISSING": _MISSING}
    args, body = [], []
    for f in fields:
        namespace[f"_set_{f.name}"] = getattr(cls, f.name).__set__  # the slot's member descriptor
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_MISSING")
            body.append(f"    if {f.name} is _MISSING:\n        {f.name} = _factory_{f.name}()")
        else:
            args.append(f.name)
        body.append(f"    _set_{f.name}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(compile(source, f"<fast_init {cls.__qualname__}>", "exec"), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init
    return cls
