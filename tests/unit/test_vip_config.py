"""The [vip] table of the group file: what is accepted, and one sentence for each mistake."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from pairmq.appliance.config import VipConfig, parse_group, render_group
from pairmq.appliance.errors import ConfigError
from pairmq.appliance.roles import Role
from tests.harness.group import REPO

P, B = Role.PRIMARY, Role.BACKUP
NODES = """
[group]
name = "g"
[nodes.primary]
address = "10.77.0.1"
[nodes.backup]
address = "10.77.0.2"
[nodes.monitor]
address = "10.77.0.3"
"""


def parse(vip: str):
    return parse_group(tomllib.loads(NODES + "[vip]\n" + vip)).vip


def test_no_vip_table_means_no_vip():
    assert parse_group(tomllib.loads(NODES)).vip is None


def test_one_interface_for_both_hosts_and_default_announcements():
    vip = parse('address = "10.77.0.100/24"\ninterface = "eth0"')
    assert vip == VipConfig("10.77.0.100", 24, {P: "eth0", B: "eth0"}, arp_count=3, arp_interval_ms=200)
    assert vip.with_prefix == "10.77.0.100/24"


def test_one_interface_per_host_and_announcement_settings_round_trip():
    raw = NODES + '[vip]\naddress = "10.77.0.100/24"\ninterface = {primary = "eth0", backup = "ens3"}\n' \
                  'arp_count = 5\narp_interval_ms = 1000\n'
    config = parse_group(tomllib.loads(raw))
    assert config.vip == VipConfig("10.77.0.100", 24, {P: "eth0", B: "ens3"}, arp_count=5, arp_interval_ms=1000)
    assert parse_group(tomllib.loads(render_group(config))).vip == config.vip


@pytest.mark.parametrize("vip, sentence", [
    ('address = "10.77.0.100"\ninterface = "eth0"',
     "vip.address must be an IPv4 address with its prefix length, like 10.0.0.100/24, not '10.77.0.100'"),
    ('address = "banana/24"\ninterface = "eth0"',
     "vip.address must be an IPv4 address with its prefix length, like 10.0.0.100/24, not 'banana/24'"),
    ('address = "10.77.0.100/33"\ninterface = "eth0"',
     "vip.address must be an IPv4 address with its prefix length, like 10.0.0.100/24, not '10.77.0.100/33'"),
    ('address = 17\ninterface = "eth0"',
     "vip.address must be an IPv4 address with its prefix length, like 10.0.0.100/24, not 17"),
    ('interface = "eth0"',
     "vip.address must be an IPv4 address with its prefix length, like 10.0.0.100/24, not None"),
    ('address = "fd00::100/64"\ninterface = "eth0"',
     "vip.address 'fd00::100/64' is IPv6; the virtual IP is announced by ARP, so it must be IPv4"),
    ('address = "10.77.0.2/24"\ninterface = "eth0"',
     "vip.address 10.77.0.2 is also a node's address; the virtual IP must be an address of its own, "
     "which moves with activity"),
    ('address = "10.77.0.3/24"\ninterface = "eth0"',
     "vip.address 10.77.0.3 is also a node's address; the virtual IP must be an address of its own, "
     "which moves with activity"),
    ('address = "10.77.0.0/24"\ninterface = "eth0"',
     "vip.address '10.77.0.0/24' is the network address of 10.77.0.0/24, not a host address"),
    ('address = "10.77.0.255/24"\ninterface = "eth0"',
     "vip.address '10.77.0.255/24' is the broadcast address of 10.77.0.0/24, not a host address"),
    ('address = "127.0.0.100/8"\ninterface = "lo"',
     "vip.address '127.0.0.100/8' is not a unicast address a client can reach"),
    ('address = "10.77.0.100/24"',
     'vip.interface must name the network interface that carries the virtual IP: one name for both hosts '
     '("eth0") or one per node ({primary = "eth0", backup = "ens3"})'),
    ('address = "10.77.0.100/24"\ninterface = {primary = "eth0"}',
     "vip.interface names no interface for the backup"),
    ('address = "10.77.0.100/24"\ninterface = {primary = "eth0", backup = "eth0", monitor = "eth0"}',
     "vip.interface names an interface for the monitor, which never holds the virtual IP"),
    ('address = "10.77.0.100/24"\ninterface = {primary = "eth0", backpu = "eth0"}',
     "unknown node 'backpu' in vip.interface (known: backup, primary)"),
    ('address = "10.77.0.100/24"\ninterface = "eth0:1"',
     "vip.interface for the primary must be an interface name of 1 to 15 characters without '/', ':' or "
     "spaces, not 'eth0:1'"),
    ('address = "10.77.0.100/24"\ninterface = "a-very-long-interface"',
     "vip.interface for the primary must be an interface name of 1 to 15 characters without '/', ':' or "
     "spaces, not 'a-very-long-interface'"),
    ('address = "10.77.0.100/24"\ninterface = ""',
     "vip.interface for the primary must be an interface name of 1 to 15 characters without '/', ':' or "
     "spaces, not ''"),
    ('address = "10.77.0.100/24"\ninterface = "eth0"\narp_count = 0',
     "vip.arp_count must be a whole number from 1 to 100, not 0"),
    ('address = "10.77.0.100/24"\ninterface = "eth0"\narp_interval_ms = 5',
     "vip.arp_interval_ms must be a whole number from 10 to 10,000, not 5"),
    ('address = "10.77.0.100/24"\ninterface = "eth0"\narp_count = true',
     "vip.arp_count must be a whole number from 1 to 100, not True"),
    ('address = "10.77.0.100/24"\ninterface = "eth0"\nport = 1883',
     "unknown key 'port' in [vip] (known: address, arp_count, arp_interval_ms, interface)"),
])
def test_a_bad_vip_table_is_one_sentence(vip, sentence):
    with pytest.raises(ConfigError) as refused:
        parse(vip)
    assert str(refused.value) == sentence


def test_vip_must_be_a_table():
    with pytest.raises(ConfigError, match=r"^the group file needs a \[vip\] table$"):
        parse_group(tomllib.loads('vip = "10.77.0.100/24"\n' + NODES))


def test_a_node_refuses_to_start_with_a_bad_vip_table(tmp_path):
    (tmp_path / "group.toml").write_text(NODES + '[vip]\naddress = "10.77.0.1/24"\ninterface = "eth0"\n')
    out = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "node", "--role", "primary",
                          "--group", str(tmp_path / "group.toml")], capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert out.returncode != 0
    assert out.stderr == ("error: vip.address 10.77.0.1 is also a node's address; the virtual IP must be an "
                          "address of its own, which moves with activity\n")
