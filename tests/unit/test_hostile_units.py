"""The systemd units cap what one node may take from its host (docs/security.md): memory and tasks.

`systemd-analyze verify` of the installed units is in tests/processes/test_install.py; here, that each unit has
both caps in its [Service] section, so a leak or a flood ends in a restart and a failover, not a starved host.
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parents[2] / "systemd"


def service_section(unit: str) -> dict[str, str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(SYSTEMD / unit)
    return dict(parser["Service"])


@pytest.mark.parametrize("unit", ["pairmq@.service", "pairmq-monitor.service"])
def test_every_unit_caps_memory_and_tasks(unit):
    service = service_section(unit)
    assert service.get("MemoryMax", "infinity") not in ("", "infinity")
    assert int(service.get("TasksMax", "0")) > 0
