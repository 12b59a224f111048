"""Numbers and sizes as people type them: `50000`, `50_000`, `1e9`, `8GiB`, `512 MiB`, `4G`.

Rules:
- A size is a number and an optional unit. KiB, MiB, GiB, TiB are powers of 1024; kB, MB, GB, TB
  powers of 1000; a bare K, M, G, T is 1024-based, as in systemd and `java -Xmx`. Units are not
  case-sensitive except that `b` alone means bytes. The result is a whole number of bytes.
- A count is a whole number; `1e6` is accepted when it is whole.
- Anything else is one sentence naming what was given and what is accepted.
"""

from __future__ import annotations

import math
import re

from pairmq.appliance.errors import PairMQError

_UNITS = {"": 1, "b": 1,
          "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3,
          "t": 1024**4, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
_SIZE = re.compile(r"\s*([0-9][0-9_,]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*")
SIZE_HINT = "a size such as 8GiB, 512MiB, 64kB, 1e9 or 4096 (bytes)"


def is_size(name: str) -> bool:
    """Settings are named with their unit last (DESIGN §2): `..._bytes` takes a size."""
    return name.endswith("_bytes")


def parse_size(text: str) -> int:
    match = _SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise PairMQError(f"{text!r} is not {SIZE_HINT}")
    value = float(match.group(1).replace("_", "").replace(",", "")) * _UNITS[unit]
    if not math.isfinite(value) or value != int(value):
        raise PairMQError(f"{text!r} is not a whole number of bytes")
    return int(value)


def parse_number(text: str) -> int | float:
    """A count or a rate: a whole number when it is one (`1e6` included), else a float."""
    cleaned = text.strip().replace("_", "").replace(",", "")
    try:
        return int(cleaned)
    except ValueError:
        pass
    try:
        value = float(cleaned)
    except ValueError:
        raise PairMQError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise PairMQError(f"{text!r} is not a finite number")
    return int(value) if value.is_integer() and "e" in cleaned.lower() else value


def format_size(n: int) -> str:
    """Bytes with the largest binary unit that keeps them whole or short: 8 GiB, 1.5 MiB, 300 B."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value.is_integer() else f"{value:.1f} {unit} ({n:,} B)"
    return f"{n:,} B"
