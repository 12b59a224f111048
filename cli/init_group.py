"""`pairmq init`: write a group file and a fresh group secret into one directory.

The group file is identical on all three hosts, so everything in it is written
relative where that keeps it portable: the secret as `secret` (next to the group
file). Each node's data directory is `<data-dir>/<role>`, so the same file also
works with all three nodes on one machine. The text is validated by the same
loader the nodes use before anything is written, and nothing is overwritten
without `force`. With `management_tls` it also makes a self-signed certificate
naming the three addresses (management.pem, key management.key, 0600) and the
group file's [management] table names them: the API speaks HTTPS and the CLI
verifies exactly that certificate.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import tomllib
from pathlib import Path

from pairmq.appliance.config import GroupConfig, NodeSpec, parse_group, render_group, write_secret
from pairmq.appliance.errors import ConfigError
from pairmq.appliance.api.settings import ManagementSettings, make_self_signed
from pairmq.appliance.roles import Role

GROUP_FILE = "group.toml"
SECRET_FILE = "secret"
CERT_FILE, KEY_FILE = "management.pem", "management.key"
DEFAULT_NAME = "pairmq"
DEFAULT_DATA_DIR = "/var/lib/pairmq"
LOOPBACK_ADDRESSES = {Role.PRIMARY: "127.0.0.1", Role.BACKUP: "127.0.0.2", Role.MONITOR: "127.0.0.3"}


@dataclasses.dataclass(frozen=True, slots=True)
class Written:
    group_file: Path
    secret_file: Path
    config: GroupConfig
    replaced: bool

    def node_commands(self) -> list[tuple[Role, str, str]]:
        """(role, address, the exact command to run on that host)."""
        group = shlex.quote(str(self.group_file))
        return [(role, self.config.node(role).address, f"pairmq node --role {role.value} --group {group}")
                for role in Role]


def group_addresses(primary: str | None, backup: str | None, monitor: str | None) -> dict[Role, str]:
    given = {Role.PRIMARY: primary, Role.BACKUP: backup, Role.MONITOR: monitor}
    if all(v is None for v in given.values()):
        return dict(LOOPBACK_ADDRESSES)
    missing = [f"--{role.value}" for role, value in given.items() if value is None]
    if missing:
        raise ConfigError(f"give all three of --primary, --backup and --monitor, or none of them for the "
                          f"one-machine layout on 127.0.0.1-3 (missing {', '.join(missing)})")
    return dict(given)  # type: ignore[arg-type]


def write_group(directory: Path, *, name: str, addresses: dict[Role, str], data_dir: str,
                force: bool = False, management_tls: bool = False) -> Written:
    directory = Path(directory)
    group_file, secret_file = directory / GROUP_FILE, directory / SECRET_FILE
    existing = [p for p in (group_file, secret_file) if p.exists()]
    if existing and not force:
        raise ConfigError(f"{existing[0]} already exists; pass --force to replace the group file and its secret")
    nodes = {role: NodeSpec(role, addresses[role], Path(data_dir) / role.value) for role in Role}
    management = (ManagementSettings(cert_file=Path(CERT_FILE), key_file=Path(KEY_FILE)) if management_tls
                  else ManagementSettings())
    text = render_group(GroupConfig(name, nodes, Path(SECRET_FILE), management=management))
    if not management_tls:
        parse_group(tomllib.loads(text), group_file)  # the nodes' own rules, before anything touches the disk

    directory.mkdir(parents=True, exist_ok=True)
    if management_tls:
        make_self_signed(directory / CERT_FILE, directory / KEY_FILE, list(addresses.values()), name)
        parse_group(tomllib.loads(text), group_file)  # with the files it names in place
    tmp_secret = directory / f".{SECRET_FILE}.new"
    tmp_secret.unlink(missing_ok=True)
    write_secret(tmp_secret)
    tmp_group = directory / f".{GROUP_FILE}.new"
    tmp_group.write_text(text, encoding="utf-8")
    # Secret first: a group file never points at a secret that is not there yet.
    os.replace(tmp_secret, secret_file)
    os.replace(tmp_group, group_file)
    config = parse_group(tomllib.loads(text), group_file.resolve())
    return Written(group_file.resolve(), secret_file.resolve(), config, bool(existing))
