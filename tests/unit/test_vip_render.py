"""`pairmq show redundancy`'s virtual IP table: exact output from a captured console."""

from io import StringIO

from rich.console import Console

from pairmq.cli.render import vip_table

NO_CAP = "cannot add virtual IP 10.0.0.100/24 on eth0: operation not permitted (the node needs CAP_NET_ADMIN)"


def vip(interface: str, held: bool, announcements: int, error: str | None = None) -> dict:
    return {"address": "10.0.0.100/24", "interface": interface, "held": held, "error": error,
            "announcements": announcements, "adds": 0, "removals": 0}


def render(renderable, width: int) -> list[str]:
    console = Console(file=StringIO(), width=width, color_system=None)
    console.print(renderable)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def test_vip_table_exact():
    nodes = [{"role": "primary", "vip": vip("eth0", False, 3, NO_CAP)},
             {"role": "backup", "vip": vip("ens3", True, 1_203)},
             {"role": "monitor", "vip": None}]
    assert render(vip_table(nodes), 100) == [
        "Virtual IP 10.0.0.100/24",
        "Role     Interface  Held  Gratuitous ARPs  Error",
        "─" * 100,
        "primary  eth0       no                  3  cannot add virtual IP 10.0.0.100/24 on eth0: operation",
        "                                           not permitted (the node needs CAP_NET_ADMIN)",
        "backup   ens3       yes             1,203  -",
    ]


def test_no_vip_table_without_a_vip_or_reachable_nodes():
    assert vip_table([{"role": "primary", "vip": None}, {"role": "monitor", "vip": None}]) is None
    assert vip_table([{"role": "primary", "reachable": False, "error": "refused"}]) is None
