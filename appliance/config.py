"""The group file: one TOML file, identical on all three hosts (DESIGN §2).

Rules checked at load, each failure a `ConfigError` naming the key or relation:
- every section and key is known (a typo is an error, not a silent default);
- the three nodes have distinct addresses; ports are 1..65535 and distinct;
- timers keep their safety relations:
    lease_ms >= 4 * heartbeat_interval_ms   (a lease outlives 3 lost heartbeats)
    takeover_margin_ms >= heartbeat_interval_ms and >= lease_ms / 10
                                             (covers clock-rate drift and the
                                              delay between a check and an act)
    lease_ms * 4 <= broker_stall_ms <= 60000 (a stalled broker event loop
                                              releases activity: far above
                                              an overload stall, which must
                                              never fail over, far below an
                                              operator's reaction time)
- limits are positive whole numbers within their ranges (see `Limits`):
  a full session queue or a full spool refuses publishes (docs/broker.md),
  so a limit of 0 would refuse everything (max_keepalive_s alone takes 0:
  no cap);
- the group secret lives in its own file (mode 0600, or a systemd credential),
  never in the group file.
- an optional [tls] table (cert_file, key_file: PEM, relative to the group
  file) turns on MQTT over TLS (>= 1.2) on ports.mqtt_tls (8883): both files
  must exist and load, the key must be unencrypted and match the certificate.
  Checked at load (appliance/tls.py), so a node never starts half-configured.
  Client certificates: require_certificate (needs ca_file, a PEM file of CAs)
  and use_identity_as_username = "cn" | "san" (needs require_certificate).
- MQTT over WebSockets listens on ports.mqtt_ws (8083) always, and with TLS on
  ports.mqtt_wss (8084) when [tls] is set.
- an optional [vip] table: the virtual IP the active holds (appliance/node/vip.py).
  `address` is an IPv4 address with its prefix length (10.0.0.100/24), not the
  network or broadcast address of its subnet and not any node's address;
  `interface` names the NIC, one name for both message-routing hosts or one
  per node ({primary = "eth0", backup = "ens3"}; never the monitor, which
  never holds it); arp_count (1..100) gratuitous ARPs, arp_interval_ms
  (10..10000) apart, announce it.
- an optional [hooks] table: scripts run on activity changes (appliance/hooks_settings.py checks
  that each exists and is executable; appliance/node/hooks.py runs them).
- an optional [sys] table: interval_s (0..86400, default 10; 0 turns it
  off), how often the active publishes `$SYS/broker/...`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import secrets
import stat
import tomllib
from pathlib import Path

from .errors import ConfigError
from .eventlog import EventSettings
from .hooks_settings import HookSettings, parse_hooks, render_hooks
from .management_settings import ManagementSettings, parse_settings, render_settings
from .roles import Role

DEFAULT_GROUP_PATH = Path("/etc/pairmq/group.toml")
CREDENTIAL_NAME = "pairmq-secret"
SECRET_BYTES = 32


@dataclasses.dataclass(frozen=True, slots=True)
class Timers:
    heartbeat_interval_ms: int = 50
    lease_ms: int = 500
    takeover_margin_ms: int = 100
    broker_stall_ms: int = 5000

    @property
    def insync_ms(self) -> int:
        """How long a standby stays in sync after its last confirmed contact.

        It must outlast the earliest moment the standby may take over after the
        active dies (lease + margin + the monitor's next heartbeat), or a crash
        of the active would leave nobody eligible.
        """
        return self.lease_ms + self.takeover_margin_ms + 4 * self.heartbeat_interval_ms

    @property
    def expected_failover_ms(self) -> int:
        """An upper estimate of crash -> takeover: the survivor waits lease + margin after the
        last claim it heard, which came up to one heartbeat before the crash."""
        return self.lease_ms + self.takeover_margin_ms + self.heartbeat_interval_ms

    def validate(self) -> None:
        for name in ("heartbeat_interval_ms", "lease_ms", "takeover_margin_ms", "broker_stall_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"timers.{name} must be a positive whole number of milliseconds, not {value!r}")
        if self.heartbeat_interval_ms < 10:
            raise ConfigError(f"timers.heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be at least 10")
        if self.lease_ms > 60_000:
            raise ConfigError(f"timers.lease_ms ({self.lease_ms}) must be at most 60000")
        if self.lease_ms < 4 * self.heartbeat_interval_ms:
            raise ConfigError(
                f"unsafe timers: lease_ms ({self.lease_ms}) must be at least 4 x heartbeat_interval_ms "
                f"({4 * self.heartbeat_interval_ms}), so that a lease survives 3 lost heartbeats"
            )
        if self.takeover_margin_ms < self.heartbeat_interval_ms:
            raise ConfigError(
                f"unsafe timers: takeover_margin_ms ({self.takeover_margin_ms}) must be at least "
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms})"
            )
        if self.takeover_margin_ms * 10 < self.lease_ms:
            raise ConfigError(
                f"unsafe timers: takeover_margin_ms ({self.takeover_margin_ms}) must be at least lease_ms / 10 "
                f"({self.lease_ms / 10:g}) to cover clock drift between hosts"
            )
        if self.broker_stall_ms < 4 * self.lease_ms:
            raise ConfigError(
                f"unsafe timers: broker_stall_ms ({self.broker_stall_ms}) must be at least 4 x lease_ms "
                f"({4 * self.lease_ms}), so that an overloaded broker never gives up activity"
            )
        if self.broker_stall_ms > 60_000:
            raise ConfigError(f"timers.broker_stall_ms ({self.broker_stall_ms}) must be at most 60000, so that a "
                              f"hung broker hands its clients to the standby within a minute")


@dataclasses.dataclass(frozen=True, slots=True)
class Ports:
    heartbeat: int = 8300
    mate_link: int = 8301
    config_sync: int = 8302
    mqtt: int = 1883
    mqtt_tls: int = 8883
    mqtt_ws: int = 8083  # MQTT over WebSockets
    mqtt_wss: int = 8084  # MQTT over WebSockets over TLS, when [tls] is set
    management: int = 8080

    def validate(self) -> None:
        seen: dict[int, str] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
                raise ConfigError(f"ports.{field.name} must be a port number 1..65535, not {value!r}")
            if value in seen:
                raise ConfigError(f"ports.{field.name} and ports.{seen[value]} are both {value}")
            seen[value] = field.name


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """What one session's queue and the whole spool may hold; at a limit the publisher is refused (0x97)."""

    session_queue_max_messages: int = 100_000
    session_queue_max_bytes: int = 64 * 1024 * 1024
    spool_max_bytes: int = 4 * 1024 * 1024 * 1024  # stored message bodies, every session and retained message
    # Duplicate suppression by message id (docs/broker.md): how long and how many ids are remembered.
    message_id_window_s: int = 300
    message_id_history_max: int = 100_000
    # Mate-link backpressure (docs/mate_link.md): above this many unacknowledged ops or bytes on the live
    # link, the active stops reading publishers until the standby catches up.
    mate_max_lag_ops: int = 10_000
    mate_max_lag_bytes: int = 64 * 1024 * 1024
    # Sessions belong to the user that made them (docs/broker.md): another user with that client id is refused
    # (0), or by this switch (1) gets a clean session, the old one discarded.
    session_other_user_clean_start: int = 0
    # Uncached password checks (scrypt) a source address / a user name may start per minute (a token bucket
    # holding a minute's worth); a successful check is refunded.
    login_checks_per_address_per_min: int = 30
    login_checks_per_user_per_min: int = 30
    password_min_length: int = 8  # bytes (UTF-8); checked when a password is set, not at login
    # The MQTT front door's budget (appliance/mqtt/budget.py, docs/broker.md "Hostile clients"): before
    # CONNECT succeeds, and per client after it.
    mqtt_connect_max_bytes: int = 128 * 1024
    mqtt_connect_max_properties: int = 128
    mqtt_preauth_max_connections: int = 40_000
    mqtt_preauth_max_per_address: int = 1_000
    mqtt_preauth_max_bytes: int = 64 * 1024 * 1024
    mqtt_output_max_bytes: int = 8 * 1024 * 1024
    subscriptions_per_client_max: int = 10_000
    subscribe_max_filters: int = 1_000
    # The longest keep alive a client may use, in seconds; 0: no cap (the protocol's 65,535). MQTT 5 clients
    # asking for more (or 0) are given it in CONNACK; 3.1.1 clients are refused with return code 2, as by
    # mosquitto (docs/broker.md "Keep alive").
    max_keepalive_s: int = 0

    RANGES = {  # name -> (minimum, maximum)
        "session_queue_max_messages": (1, 10_000_000),
        "session_queue_max_bytes": (1024, 1 << 40),
        "spool_max_bytes": (64 * 1024, 1 << 44),
        "message_id_window_s": (1, 7 * 24 * 3600),
        "message_id_history_max": (1, 10_000_000),
        "mate_max_lag_ops": (1, 1_000_000),
        "mate_max_lag_bytes": (64 * 1024, 1 << 36),
        "session_other_user_clean_start": (0, 1),
        "login_checks_per_address_per_min": (1, 1_000_000),
        "login_checks_per_user_per_min": (1, 1_000_000),
        "password_min_length": (1, 1024),
        "mqtt_connect_max_bytes": (1024, 1 << 28),
        "mqtt_connect_max_properties": (1, 1 << 20),
        "mqtt_preauth_max_connections": (1, 1_000_000),
        "mqtt_preauth_max_per_address": (1, 1_000_000),
        "mqtt_preauth_max_bytes": (1 << 20, 1 << 36),
        "mqtt_output_max_bytes": (64 * 1024, 1 << 32),
        "subscriptions_per_client_max": (1, 10_000_000),
        "subscribe_max_filters": (1, 5_000),  # one SUBSCRIBE's ops must fit one spool commit (10,000 ops)
        "max_keepalive_s": (0, 65_535),
    }

    def validate(self) -> None:
        for name, (low, high) in self.RANGES.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(f"limits.{name} must be a whole number from {low:,} to {high:,}, not {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class SysTopics:
    """[sys]: the `$SYS/broker/...` statistics the active publishes (appliance/broker/sys_topics.py)."""

    interval_s: int = 10  # mosquitto's sys_interval and its default; 0: not published

    RANGES = {"interval_s": (0, 86_400)}

    def validate(self) -> None:
        for name, (low, high) in self.RANGES.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ConfigError(f"sys.{name} must be a whole number from {low:,} to {high:,}, not {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSpec:
    role: Role
    address: str
    data_dir: Path


@dataclasses.dataclass(frozen=True, slots=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    # Client certificates (appliance/tls.py has the rules).
    require_certificate: bool = False
    ca_file: Path | None = None
    use_identity_as_username: str | None = None  # "cn" or "san"


@dataclasses.dataclass(frozen=True, slots=True)
class VipConfig:
    """The optional virtual IP: `address` without its prefix, which is `prefix_len`."""

    address: str
    prefix_len: int
    interfaces: dict[Role, str]  # primary and backup
    arp_count: int = 3
    arp_interval_ms: int = 200

    @property
    def with_prefix(self) -> str:
        return f"{self.address}/{self.prefix_len}"


@dataclasses.dataclass(frozen=True, slots=True)
class GroupConfig:
    name: str
    nodes: dict[Role, NodeSpec]
    secret_file: Path
    timers: Timers = Timers()
    ports: Ports = Ports()
    auto_revert: bool = False
    path: Path | None = None
    tls: TlsConfig | None = None
    limits: Limits = Limits()
    events: EventSettings = EventSettings()
    vip: VipConfig | None = None
    management: ManagementSettings = ManagementSettings()  # the API listener on 8080
    hooks: HookSettings = HookSettings()  # scripts run on activity changes
    sys: SysTopics = SysTopics()

    def node(self, role: Role) -> NodeSpec:
        return self.nodes[role]

    def mqtt_reference(self, role: Role) -> str:
        return f"{self.nodes[role].address}:{self.ports.mqtt}"

    def host_list(self) -> str:
        return ",".join(self.mqtt_reference(r) for r in (Role.PRIMARY, Role.BACKUP))


_SECTIONS = {
    "group": {"name", "secret_file", "auto_revert"},
    "timers": {f.name for f in dataclasses.fields(Timers)},
    "ports": {f.name for f in dataclasses.fields(Ports)},
    "limits": {f.name for f in dataclasses.fields(Limits)},
    "nodes": {r.value for r in Role},
    "tls": {"cert_file", "key_file", "require_certificate", "ca_file", "use_identity_as_username"},
    "events": {f.name for f in dataclasses.fields(EventSettings)},
    "vip": {"address", "interface", "arp_count", "arp_interval_ms"},
    "management": set(),  # appliance/management_settings.py checks its keys
    "hooks": set(),  # appliance/hooks_settings.py checks its keys
    "sys": {f.name for f in dataclasses.fields(SysTopics)},
}
_NODE_KEYS = {"address", "data_dir"}


def load_group(path: str | os.PathLike[str]) -> GroupConfig:
    """Read and validate a group file; every problem is one ConfigError sentence."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"group file {path} does not exist (create one with `pairmq init`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read group file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"group file {path} is not valid TOML: {exc}") from None
    return parse_group(raw, path)


def parse_group(raw: dict, path: Path | None = None) -> GroupConfig:
    base = path.parent if path else Path.cwd()
    _check_keys(raw, set(_SECTIONS), "the group file")
    group = _table(raw, "group")
    _check_keys(group, _SECTIONS["group"], "[group]")
    name = group.get("name")
    if not isinstance(name, str) or not name or len(name.encode()) > 64:
        raise ConfigError("group.name must be a non-empty string of at most 64 bytes")
    secret_file = group.get("secret_file", "secret")
    if not isinstance(secret_file, str) or not secret_file:
        raise ConfigError("group.secret_file must be a path")
    auto_revert = group.get("auto_revert", False)
    if not isinstance(auto_revert, bool):
        raise ConfigError(f"group.auto_revert must be true or false, not {auto_revert!r}")

    timers = _settings(raw, "timers", Timers)
    ports = _settings(raw, "ports", Ports)
    limits = _settings(raw, "limits", Limits)
    events = _settings(raw, "events", EventSettings)

    nodes_raw = _table(raw, "nodes")
    _check_keys(nodes_raw, _SECTIONS["nodes"], "[nodes]")
    nodes: dict[Role, NodeSpec] = {}
    for role in Role:
        spec = nodes_raw.get(role.value)
        if not isinstance(spec, dict):
            raise ConfigError(f"the group file needs a [nodes.{role.value}] table with its address")
        _check_keys(spec, _NODE_KEYS, f"[nodes.{role.value}]")
        address = spec.get("address")
        try:
            ipaddress.ip_address(address)
        except (ValueError, TypeError):
            raise ConfigError(f"nodes.{role.value}.address must be an IP address, not {address!r}") from None
        data_dir = spec.get("data_dir", "/var/lib/pairmq")
        if not isinstance(data_dir, str) or not data_dir:
            raise ConfigError(f"nodes.{role.value}.data_dir must be a path")
        nodes[role] = NodeSpec(role, address, (base / data_dir).resolve())
    addresses = [n.address for n in nodes.values()]
    if len(set(addresses)) != len(addresses):
        raise ConfigError(f"the three nodes need distinct addresses, got {', '.join(addresses)}")
    tls = _parse_tls(raw, base)
    vip = _parse_vip(raw, addresses)
    management = parse_settings(_table(raw, "management", required=False), base)
    hooks = parse_hooks(_table(raw, "hooks", required=False), base)
    sys_topics = _settings(raw, "sys", SysTopics)
    return GroupConfig(name, nodes, (base / secret_file).resolve(), timers, ports, auto_revert, path, tls, limits,
                       events, vip, management, hooks, sys_topics)


def _parse_tls(raw: dict, base: Path) -> TlsConfig | None:
    if "tls" not in raw:
        return None
    table = _table(raw, "tls")
    _check_keys(table, _SECTIONS["tls"], "[tls]")
    paths = {}
    for key in ("cert_file", "key_file"):
        value = table.get(key)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"tls.{key} must be the path of a PEM file ([tls] needs cert_file and key_file)")
        paths[key] = (base / value).resolve()
    require = table.get("require_certificate", False)
    if not isinstance(require, bool):
        raise ConfigError(f"tls.require_certificate must be true or false, not {require!r}")
    ca_file = table.get("ca_file")
    if ca_file is not None and (not isinstance(ca_file, str) or not ca_file):
        raise ConfigError("tls.ca_file must be the path of a PEM file")
    identity = table.get("use_identity_as_username")
    if identity is not None and not isinstance(identity, str):
        raise ConfigError(f"tls.use_identity_as_username must be \"cn\" or \"san\", not {identity!r}")
    tls = TlsConfig(paths["cert_file"], paths["key_file"], require,
                    (base / ca_file).resolve() if ca_file is not None else None, identity)
    from .tls import check_client_certificates, check_tls_files

    check_tls_files(tls)
    check_client_certificates(tls)
    return tls


_IFNAME_MAX = 15  # IFNAMSIZ - 1
_VIP_RANGES = {"arp_count": (1, 100), "arp_interval_ms": (10, 10_000)}


def _parse_vip(raw: dict, node_addresses: list[str]) -> VipConfig | None:
    if "vip" not in raw:
        return None
    table = _table(raw, "vip")
    _check_keys(table, _SECTIONS["vip"], "[vip]")
    text = table.get("address")
    example = "like 10.0.0.100/24"
    if not isinstance(text, str) or "/" not in text:
        raise ConfigError(f"vip.address must be an IPv4 address with its prefix length, {example}, not {text!r}")
    try:
        iface = ipaddress.ip_interface(text.strip())
    except ValueError:
        raise ConfigError(f"vip.address must be an IPv4 address with its prefix length, {example}, "
                          f"not {text!r}") from None
    if iface.version != 4:
        raise ConfigError(f"vip.address {text!r} is IPv6; the virtual IP is announced by ARP, so it must be IPv4")
    net = iface.network
    if iface.ip.is_loopback or iface.ip.is_multicast or iface.ip.is_unspecified:
        raise ConfigError(f"vip.address {text!r} is not a unicast address a client can reach")
    if net.prefixlen < 31 and iface.ip in (net.network_address, net.broadcast_address):
        raise ConfigError(f"vip.address {text!r} is the {'network' if iface.ip == net.network_address else 'broadcast'}"
                          f" address of {net}, not a host address")
    for address in node_addresses:
        if ipaddress.ip_address(address) == iface.ip:
            raise ConfigError(f"vip.address {iface.ip} is also a node's address; the virtual IP must be an address "
                              f"of its own, which moves with activity")
    settings = {}
    for key, (low, high) in _VIP_RANGES.items():
        value = table.get(key, VipConfig.__dataclass_fields__[key].default)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(f"vip.{key} must be a whole number from {low:,} to {high:,}, not {value!r}")
        settings[key] = value
    return VipConfig(str(iface.ip), net.prefixlen, _vip_interfaces(table.get("interface")), **settings)


def _vip_interfaces(value) -> dict[Role, str]:
    """One interface name for both message-routing hosts, or a table naming each."""
    routing = (Role.PRIMARY, Role.BACKUP)
    if value is None:
        raise ConfigError('vip.interface must name the network interface that carries the virtual IP: one name '
                          'for both hosts ("eth0") or one per node ({primary = "eth0", backup = "ens3"})')
    if not isinstance(value, dict):
        value = {role.value: value for role in routing}
    for key in value:
        if key == Role.MONITOR.value:
            raise ConfigError("vip.interface names an interface for the monitor, which never holds the virtual IP")
        if key not in {r.value for r in routing}:
            raise ConfigError(f"unknown node {key!r} in vip.interface (known: backup, primary)")
    interfaces = {}
    for role in routing:
        name = value.get(role.value)
        if name is None:
            raise ConfigError(f"vip.interface names no interface for the {role.value}")
        if (not isinstance(name, str) or not name or len(name) > _IFNAME_MAX or name in (".", "..")
                or any(c in name for c in "/: \t\n")):
            raise ConfigError(f"vip.interface for the {role.value} must be an interface name of 1 to "
                              f"{_IFNAME_MAX} characters without '/', ':' or spaces, not {name!r}")
        interfaces[role] = name
    return interfaces


def _table(raw: dict, key: str, *, required: bool = True) -> dict:
    value = raw.get(key, None if required else {})
    if not isinstance(value, dict):
        raise ConfigError(f"the group file needs a [{key}] table")
    return value


def _settings(raw: dict, name: str, cls):
    """An optional table of typed settings: known keys only, each validated (a ConfigError names it)."""
    table = _table(raw, name, required=False)
    _check_keys(table, _SECTIONS[name], f"[{name}]")
    settings = cls(**table)
    settings.validate()
    return settings


def _check_keys(table: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {where} (known: {', '.join(sorted(allowed))})")


# --- the secret ---------------------------------------------------------------


def load_secret(config: GroupConfig) -> bytes:
    """The group secret we send with: a systemd credential if one is passed, else the secret file."""
    return load_keyring(config).send_secret


def load_keyring(config: GroupConfig):
    """The secret file's (or credential's) keyring: one key, or two during a rotation (appliance/keyring.py)."""
    from .keyring import Keyring

    cred_dir = os.environ.get("CREDENTIALS_DIRECTORY")
    path = Path(cred_dir) / CREDENTIAL_NAME if cred_dir and (Path(cred_dir) / CREDENTIAL_NAME).exists() else config.secret_file
    try:
        st = path.stat()
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise ConfigError(f"group secret {path} does not exist (create one with `pairmq init`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read group secret {path}: {exc}") from None
    if path == config.secret_file and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"group secret {path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); run chmod 600 {path}")
    return Keyring.from_text(text, str(path))


def write_secret(path: Path) -> None:
    """Create a new random secret, mode 0600 from the first byte written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(SECRET_BYTES) + "\n")


def render_group(config: GroupConfig) -> str:
    """The group file text for `config` (paths written as given, relative or not)."""
    lines = [
        "# PairMQ group file: identical on all three hosts. The secret is not in here.",
        "[group]",
        f"name = {_q(config.name)}",
        f"secret_file = {_q(str(config.secret_file))}",
        f"auto_revert = {'true' if config.auto_revert else 'false'}",
        "",
        "[timers]",
        *(f"{f.name} = {getattr(config.timers, f.name)}" for f in dataclasses.fields(Timers)),
        "",
        "[ports]",
        *(f"{f.name} = {getattr(config.ports, f.name)}" for f in dataclasses.fields(Ports)),
        "",
        "[limits]",
        *(f"{f.name} = {getattr(config.limits, f.name)}" for f in dataclasses.fields(Limits)),
    ]
    for role in Role:
        node = config.nodes[role]
        lines += ["", f"[nodes.{role.value}]", f"address = {_q(node.address)}", f"data_dir = {_q(str(node.data_dir))}"]
    if config.events != EventSettings():
        lines += ["", "[events]", *(f"{f.name} = {_toml_value(getattr(config.events, f.name))}"
                                    for f in dataclasses.fields(EventSettings))]
    if config.tls is not None:
        lines += ["", "[tls]", f"cert_file = {_q(str(config.tls.cert_file))}",
                  f"key_file = {_q(str(config.tls.key_file))}"]
        if config.tls.require_certificate:
            lines.append("require_certificate = true")
        if config.tls.ca_file is not None:
            lines.append(f"ca_file = {_q(str(config.tls.ca_file))}")
        if config.tls.use_identity_as_username is not None:
            lines.append(f"use_identity_as_username = {_q(config.tls.use_identity_as_username)}")
    if config.vip is not None:
        vip = config.vip
        names = set(vip.interfaces.values())
        interface = (_q(names.pop()) if len(names) == 1 else
                     "{" + ", ".join(f"{r.value} = {_q(n)}" for r, n in vip.interfaces.items()) + "}")
        lines += ["", "[vip]", f"address = {_q(vip.with_prefix)}", f"interface = {interface}",
                  f"arp_count = {vip.arp_count}", f"arp_interval_ms = {vip.arp_interval_ms}"]
    lines += render_settings(config.management)
    lines += render_hooks(config.hooks)
    if config.sys != SysTopics():
        lines += ["", "[sys]", *(f"{f.name} = {getattr(config.sys, f.name)}" for f in dataclasses.fields(SysTopics))]
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
