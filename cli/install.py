"""`pairmq install --role R`: set up one host to run its PairMQ node under systemd.

Rules:
- One implementation. `pairmq install` and systemd/install.sh (the system python3 on a source checkout,
  before any venv exists) both run `install()` here, so this module imports the standard library and
  appliance.config only: the group file's own error sentences, no rich, no aiohttp.
- Root only. With --root DIR everything goes under DIR (a throwaway root, an image being built): the
  user is made with `useradd --root DIR`, units are enabled with `systemctl --root DIR` (symlinks only),
  nothing is started. --no-start also leaves the services unstarted.
- Everything is checked before anything is changed: the role, the group file (appliance.config's
  loader), the role's address being one of this host's (not under --root: that is another host), the
  node's data_dir (must be /var/lib/pairmq or below: the units' StateDirectory, the only
  place ProtectSystem=strict lets the node write), the secret, the admin credential, the unit files
  (package data), the tools (useradd when the user is missing, systemctl), every target path being
  writable, and the software: pip resolves what it would install (`--dry-run`, in a scratch venv) before
  the service venv is touched. A refusal is one sentence and leaves the root as it was.
- The service venv gets the extras the group file needs (cli/extras.py): a routing node of a group with
  [vip] gets `pairmq[vip]`; an existing venv without them has them added; a --venv without them is refused.
- Idempotent: each step compares what is there with what it would write and says "unchanged"; a second
  run changes nothing and says so.
- What gets which mode: /etc/pairmq 0750 root:pairmq, group.toml 0640 root:pairmq, the secret 0600
  root:root (the node reads it only as the systemd credential `pairmq-secret`), the admin credential
  (appliance/api/admin_credential.py, default: `admin` beside the secret) 0600 root:root (the node reads it
  only as the systemd credential `pairmq-admin`, copied at each start), the management API's certificate
  0644 and key 0640 root:pairmq when the group file's [management] names them (relative to the group
  file, so they land in /etc/pairmq),
  /var/lib/pairmq and /var/log/pairmq 0750 pairmq:pairmq, unit files 0644 root:root.
- The unit files are package data (pairmq.systemd); their Documentation= names the docs where the service
  venv's own pairmq has them (pairmq.docs).
- The virtual IP's drop-in (CAP_NET_ADMIN, CAP_NET_RAW, AF_PACKET) is written for a routing node only
  when the group file has a [vip] table, and removed when it no longer has one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

from pairmq.appliance.config import load_group, load_secret
from pairmq.appliance.errors import ConfigError, PairMQError
from pairmq.appliance.roles import Role

from . import install_software as software
from .install_software import InstallError
from .options import GROUP_ENV, group_path

USER = "pairmq"
ETC = Path("/etc/pairmq")
STATE = Path("/var/lib/pairmq")
LOGS = Path("/var/log/pairmq")
VENV = Path("/opt/pairmq/venv")
ADMIN_FILE = "admin"  # appliance.api.admin_credential.ADMIN_FILE
UNIT_DIR = Path("/etc/systemd/system")
UNIT_PACKAGE = "pairmq.systemd"
VIP_DROP_IN = """\
# Written by `pairmq install` because the group file has a [vip] table: the active node adds the
# virtual address (netlink, CAP_NET_ADMIN) and announces it with gratuitous ARP (a packet socket,
# CAP_NET_RAW). Without [vip] this file is removed and the node runs with no capabilities at all.
[Service]
AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW
CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW
RestrictAddressFamilies=AF_PACKET
"""
ROLES = tuple(r.value for r in Role)


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    role: Role
    root: Path
    group_text: bytes
    secret_text: bytes
    admin_text: bytes
    extra_files: tuple[tuple[str, bytes, int], ...]  # (name under /etc/pairmq, content, mode): management TLS
    vip: bool
    venv: Path  # on the target system
    build_venv: bool  # False: --venv named an existing one
    package: str  # what pip installs, with the extras the group file needs
    pip_options: tuple[str, ...]
    start: bool
    unit_text: str = ""  # the unit file as shipped (package data)
    add_extras: tuple[str, ...] = ()  # extras an existing service venv lacks

    def at(self, path: Path) -> Path:
        """`path` on the target system, as seen from here (under --root)."""
        return self.root / path.relative_to("/")

    @property
    def unit(self) -> str:
        return "pairmq-monitor.service" if self.role is Role.MONITOR else f"pairmq@{self.role.value}.service"

    @property
    def unit_file(self) -> str:
        return _unit_file(self.role)


def plan(role: str, group: Path, *, root: Path = Path("/"), secret: Path | None = None, venv: Path | None = None,
         package: str | None = None, pip_options: tuple[str, ...] = (), start: bool = True,
         admin: Path | None = None) -> Plan:
    """Check everything; change nothing. Raises InstallError or ConfigError (one sentence each)."""
    if os.geteuid() != 0:
        raise InstallError("pairmq install must run as root (it creates a system user and writes under /etc); "
                           "try sudo")
    try:
        the_role = Role(role)
    except ValueError:
        raise InstallError(f"unknown role {role!r}: choose primary, backup or monitor") from None
    if not root.is_absolute() or not root.is_dir():
        raise InstallError(f"--root {root} must be an existing directory, given as an absolute path")
    config = load_group(group)
    raw = tomllib.loads(group.read_text(encoding="utf-8"))
    if the_role.value not in raw.get("nodes", {}):
        raise InstallError(f"the group file {group} has no [nodes.{the_role.value}] table")
    data_dir = Path(raw["nodes"][the_role.value].get("data_dir", str(STATE)))
    if not data_dir.is_absolute() or not (data_dir == STATE or STATE in data_dir.parents):
        raise InstallError(f"nodes.{the_role.value}.data_dir is {str(data_dir)!r}; under systemd it must be {STATE} "
                           f"or below it (the unit's StateDirectory, the only place the node may write)")
    address = config.node(the_role).address
    if root == Path("/") and not address_is_local(address):
        raise InstallError(f"nodes.{the_role.value}.address {address} is not an address of this host: wrong --role, "
                           f"or configure the address first")
    if secret is not None:
        config = dataclasses.replace(config, secret_file=secret.resolve())
    os.environ.pop("CREDENTIALS_DIRECTORY", None)  # check the file we were given, not an inherited credential
    secret_bytes = load_secret(config)
    admin_text = _admin_text(admin or config.secret_file.parent / ADMIN_FILE, group)
    extra_files = _management_files(raw, group)
    vip = "vip" in raw
    unit_text = unit_source(_unit_file(the_role))
    _check_tools(root)
    extras = ("vip",) if vip and the_role.routes_messages else ()
    spec = software.with_extras(package or software.default_package(), extras)
    _check_writable(root, [ETC, STATE, LOGS, UNIT_DIR, *([] if venv else [VENV])])
    add_extras = _check_software(root, venv, spec, extras, tuple(pip_options))
    return Plan(the_role, root, group.read_bytes(), secret_bytes.hex().encode() + b"\n", admin_text, extra_files,
                vip, venv or VENV, venv is None, spec, tuple(pip_options), start and root == Path("/"),
                unit_text, add_extras)


def _check_software(root: Path, venv: Path | None, spec: str, extras: tuple[str, ...],
                    pip_options: tuple[str, ...]) -> tuple[str, ...]:
    """A --venv must already hold pairmq and the extras; /opt/pairmq/venv must be one pip would build (or
    complete). Returns the extras an existing /opt/pairmq/venv lacks."""
    if venv is not None:
        if not venv.is_absolute():
            raise InstallError(f"--venv {venv} must be an absolute path")
        if not os.access(root / venv.relative_to("/") / "bin" / "pairmq", os.X_OK):
            raise InstallError(f"--venv {venv} has no executable bin/pairmq (under {root})")
        lacking = software.missing_extras(root / venv.relative_to("/") / "bin" / "python", extras)
        if lacking:
            raise InstallError(f"--venv {venv} lacks the {', '.join(lacking)} extra the group file's [vip] needs: "
                               f"run {venv}/bin/pip install 'pairmq[{','.join(lacking)}]'")
        return ()
    existing = root / VENV.relative_to("/")
    built = os.access(existing / "bin" / "pairmq", os.X_OK)
    lacking = software.missing_extras(existing / "bin" / "python", extras) if built else ()
    if lacking or not built:
        software.check_resolvable(spec, pip_options, VENV)
    return lacking


def _unit_file(role: Role) -> str:
    return "pairmq-monitor.service" if role is Role.MONITOR else "pairmq@.service"


def unit_source(name: str) -> str:
    """A unit file as shipped with this pairmq (package data), unchanged."""
    try:
        return resources.files(UNIT_PACKAGE).joinpath(name).read_text(encoding="utf-8")
    except (OSError, ModuleNotFoundError):
        raise InstallError(f"the unit file {name} is missing from this installation of pairmq (package "
                           f"{UNIT_PACKAGE}): reinstall pairmq") from None


def _check_tools(root: Path) -> None:
    """The tools the steps run are there."""
    if shutil.which("systemctl") is None:
        raise InstallError("systemctl is not installed: pairmq install sets the node up as a systemd service")
    try:
        lines = (root / "etc/passwd").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = []
    create = not any(line.split(":", 1)[0] == USER for line in lines)
    if create and shutil.which("useradd") is None:
        raise InstallError(f"useradd is not installed, and the system user {USER} does not exist yet")


def _check_writable(root: Path, paths: list[Path]) -> None:
    """Each path can be made (or is) a directory we may write in: a read-only /opt or /etc fails here."""
    for path in paths:
        target = root / path.relative_to("/")
        if target.exists() and not target.is_dir():
            raise InstallError(f"{path} exists and is not a directory")
        nearest = next(a for a in [target, *target.parents] if a.exists())
        if not os.access(nearest, os.W_OK):
            raise InstallError(f"{path} cannot be written ({nearest} is read-only)")


def _admin_text(path: Path, group: Path) -> bytes:
    """The admin credential file's bytes, checked as a node checks it: without one the node's API has no
    browser login, and a malformed one would stop the node at start."""
    from pairmq.appliance.api.admin_credential import read_admin

    if read_admin(path) is None:
        raise InstallError(f"no admin credential at {path}: write one with `pairmq admin passwd --group {group}` "
                           f"(or pass --admin FILE)")
    return path.read_bytes()


def _management_files(raw: dict, group: Path) -> tuple[tuple[str, bytes, int], ...]:
    """The management API's certificate (0644) and key (0640), to install beside the group file."""
    table = raw.get("management", {})
    files = []
    for key, mode in (("cert_file", 0o644), ("key_file", 0o640), ("ca_file", 0o644)):
        if key not in table:
            continue
        name = Path(table[key])
        if name.is_absolute() or len(name.parts) != 1:
            raise InstallError(f"management.{key} is {table[key]!r}; to be installed it must be a file name beside "
                               f"the group file (it goes to {ETC})")
        files.append((name.name, (group.parent / name).read_bytes(), mode))
    return tuple(files)


def address_is_local(address: str) -> bool:
    """Whether this host has `address` (binding to it works): the node binds it, so it must."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def install(p: Plan, say=print) -> list[str]:
    """Carry out the plan; returns (and says) one sentence per step."""
    said: list[str] = []

    def step(sentence: str) -> None:
        said.append(sentence)
        say(sentence)

    step(_ensure_user(p))
    uid, gid = _ids(p)
    step(_ensure_dir(p, ETC, 0, gid, 0o750))
    inputs = [_ensure_file(p, ETC / "group.toml", p.group_text, 0, gid, 0o640),
              _ensure_file(p, ETC / "secret", p.secret_text, 0, 0, 0o600),
              _ensure_file(p, ETC / ADMIN_FILE, p.admin_text, 0, 0, 0o600)]
    inputs += [_ensure_file(p, ETC / name, content, 0, gid if mode == 0o640 else 0, mode)
               for name, content, mode in p.extra_files]
    for sentence in inputs:
        step(sentence)
    step(_ensure_dir(p, STATE, uid, gid, 0o750))
    step(_ensure_dir(p, LOGS, uid, gid, 0o750))
    inputs.append(_ensure_venv(p))
    step(inputs[-1])
    unit_changed = _ensure_units(p, step)
    # A running node reads its group file, secret, admin credential and software only at start: a change restarts it.
    step(_enable(p, unit_changed, restart=unit_changed or any(not s.startswith("unchanged") for s in inputs)))
    if all(s.startswith("unchanged") for s in said):
        step(f"nothing changed: this host was already installed as the {p.role.value}")
    return said


# --- steps -----------------------------------------------------------------------------


def _ensure_user(p: Plan) -> str:
    if _passwd_entry(p, "passwd") is not None:
        return f"unchanged: system user {USER} exists"
    argv = ["useradd", "--system", "--user-group", "--home-dir", str(STATE), "--no-create-home",
            "--shell", "/usr/sbin/nologin", "--comment", "PairMQ node", USER]
    if p.root != Path("/"):
        argv[1:1] = ["--root", str(p.root)]
    software.run(argv, f"useradd could not create the system user {USER}")
    return f"created: system user and group {USER}"


def _passwd_entry(p: Plan, table: str) -> list[str] | None:
    try:
        lines = p.at(Path("/etc") / table).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return None
    return next((line.split(":") for line in lines if line.split(":", 1)[0] == USER), None)


def _ids(p: Plan) -> tuple[int, int]:
    user, group = _passwd_entry(p, "passwd"), _passwd_entry(p, "group")
    if user is None or group is None:
        raise InstallError(f"the system user {USER} is missing from {p.at(Path('/etc/passwd'))} after useradd")
    return int(user[2]), int(group[2])


def _ensure_dir(p: Plan, path: Path, uid: int, gid: int, mode: int) -> str:
    target = p.at(path)
    if target.is_dir():
        st = target.stat()
        if (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, mode):
            return f"unchanged: {path}"
        verb = "changed"
    else:
        target.mkdir(parents=True)
        verb = "created"
    os.chown(target, uid, gid)
    target.chmod(mode)
    return f"{verb}: {path} ({mode:04o}, {_owner(p, uid, gid)})"


def _ensure_file(p: Plan, path: Path, content: bytes, uid: int, gid: int, mode: int) -> str:
    target = p.at(path)
    if target.is_file():
        st = target.stat()
        if target.read_bytes() == content and (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, mode):
            return f"unchanged: {path}"
        verb = "changed"
    else:
        verb = "created"
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.new")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others, not even briefly
    with os.fdopen(fd, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.chown(temp, uid, gid)
    temp.chmod(mode)
    temp.replace(target)
    return f"{verb}: {path} ({mode:04o}, {_owner(p, uid, gid)})"


def _owner(p: Plan, uid: int, gid: int) -> str:
    return f"{USER if uid else 'root'}:{USER if gid else 'root'}"


def _ensure_venv(p: Plan) -> str:
    venv = p.at(p.venv)
    if not p.build_venv:
        return f"unchanged: using the existing {p.venv}"
    if os.access(venv / "bin" / "pairmq", os.X_OK):
        if p.add_extras:
            software.install_into(venv / "bin" / "python", p.package, p.pip_options, p.venv)
            return f"changed: {p.venv} (added the {', '.join(p.add_extras)} extra: {p.package})"
        return f"unchanged: {p.venv} (to upgrade: {p.venv}/bin/pip install --upgrade '{p.package}')"
    software.run([sys.executable, "-m", "venv", str(venv)], f"could not create the virtual environment {p.venv}")
    software.install_into(venv / "bin" / "python", p.package, p.pip_options, p.venv)
    if not os.access(venv / "bin" / "pairmq", os.X_OK):
        raise InstallError(f"pip installed {p.package} but {p.venv}/bin/pairmq is missing")
    return f"built: {p.venv} with {p.package}"


def render_unit(text: str, venv: Path, docs: Path | None) -> str:
    """A shipped unit file with ExecStart pointing at `venv` and Documentation= at the docs it holds."""
    text = text.replace(f"{VENV}/bin/pairmq", f"{venv}/bin/pairmq")
    if docs is None:  # a prefix without its own python or docs: say nothing rather than point nowhere
        return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("Documentation="))
    return "".join(f"Documentation=file://{docs}\n" if line.startswith("Documentation=") else line
                   for line in text.splitlines(keepends=True))


def _ensure_units(p: Plan, step) -> bool:
    changes = []
    unit = UNIT_DIR / p.unit_file
    docs = software.docs_location(p.at(p.venv) / "bin" / "python", p.root)
    changes.append(_ensure_file(p, unit, render_unit(p.unit_text, p.venv, docs).encode(), 0, 0, 0o644))
    if p.role.routes_messages:
        drop_in = UNIT_DIR / f"{p.unit}.d" / "vip.conf"
        if p.vip:
            changes.append(_ensure_file(p, drop_in, VIP_DROP_IN.encode(), 0, 0, 0o644))
        elif p.at(drop_in).exists():
            p.at(drop_in).unlink()
            changes.append(f"removed: {drop_in} (the group file has no [vip] table)")
    for sentence in changes:
        step(sentence)
    return any(not s.startswith("unchanged") for s in changes)


def _enable(p: Plan, unit_changed: bool, restart: bool) -> str:
    wants = p.at(UNIT_DIR / "multi-user.target.wants" / p.unit)
    enabled = wants.is_symlink()
    if p.root != Path("/"):
        if not enabled:
            software.run(["systemctl", "--root", str(p.root), "enable", p.unit], f"systemctl could not enable {p.unit}")
        return f"{'unchanged' if enabled else 'enabled'}: {p.unit} (not started: --root)"
    if unit_changed:
        software.run(["systemctl", "daemon-reload"], "systemctl daemon-reload failed")
    if not enabled:
        software.run(["systemctl", "enable", p.unit], f"systemctl could not enable {p.unit}")
    if not p.start:
        return f"{'unchanged' if enabled and not restart else 'enabled'}: {p.unit} (not started: --no-start)"
    active = subprocess.run(["systemctl", "is-active", "--quiet", p.unit]).returncode == 0
    if active and not restart:
        return f"unchanged: {p.unit} is enabled and running"
    software.run(["systemctl", "restart" if active else "start", p.unit], f"systemctl could not start {p.unit} "
         f"(see `systemctl status {p.unit}` and `journalctl -u {p.unit}`)")
    return f"{'restarted' if active else 'started'}: {p.unit}"


# --- command line (shared by `pairmq install` and systemd/install.sh) ------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", required=True, choices=ROLES, help="this host's role")
    parser.add_argument("--group", type=Path, metavar="FILE",
                        help=f"the group file to install (default: ${GROUP_ENV}, else {ETC / 'group.toml'})")
    parser.add_argument("--secret", type=Path, metavar="FILE",
                        help="the group secret (default: the group file's secret_file)")
    parser.add_argument("--admin", type=Path, metavar="FILE",
                        help="the admin credential (default: the file admin beside the secret)")
    parser.add_argument("--root", type=Path, default=Path("/"), metavar="DIR",
                        help="install under DIR instead of / (nothing is started)")
    parser.add_argument("--no-start", action="store_true", help="install and enable, but do not start")
    parser.add_argument("--venv", type=Path, metavar="PATH",
                        help="use this existing virtual environment (or prefix) with bin/pairmq "
                             "instead of building /opt/pairmq/venv")
    parser.add_argument("--package", metavar="SPEC",
                        help="what pip installs into /opt/pairmq/venv, without extras: those the group file needs "
                             "are added (default: this source tree, else this version of pairmq)")
    parser.add_argument("--pip-option", action="append", default=[], metavar="OPT",
                        help="passed to pip install, e.g. --pip-option=--no-index --pip-option=--find-links=/srv/wheels")
    parser.add_argument("--json", action="store_true",
                        help="print the steps as one JSON document instead of one sentence each")


EXAMPLES = ("pairmq install --role primary --group ./group.toml --secret ./secret",
            "pairmq install --role monitor --no-start",
            "pairmq install --role backup --json",
            "sudo systemd/install.sh --role backup --group ./group.toml --secret ./secret")


def run(args: argparse.Namespace, say=print, say_json=lambda doc: print(json.dumps(doc, indent=2))) -> list[str]:
    """Plan, then install; with --json the sentences become one document, given to `say_json` at the end."""
    the_plan = plan(args.role, group_path(args), root=args.root, secret=args.secret, venv=args.venv,
                    package=args.package, pip_options=tuple(args.pip_option), start=not args.no_start,
                    admin=args.admin)
    said = install(the_plan, say=(lambda sentence: None) if args.json else say)
    if args.json:
        say_json(document(the_plan, said))
    return said


def document(p: Plan, said: list[str]) -> dict:
    """--json: each step as {outcome, detail} ("created", "/etc/pairmq (0750, root:pairmq)")."""
    steps = [dict(zip(("outcome", "detail"), (part.strip() for part in s.split(":", 1)))) for s in said]
    return {"role": p.role.value, "unit": p.unit, "venv": str(p.venv), "package": p.package,
            "changed": any(s["outcome"] not in ("unchanged", "nothing changed") for s in steps), "steps": steps}


def main(argv: list[str] | None = None) -> int:
    """systemd/install.sh's entry point: the same arguments and sentences as `pairmq install`."""
    parser = argparse.ArgumentParser(prog="install.sh", description="Set up this host to run its PairMQ node "
                                     "under systemd.", epilog="examples:\n  " + "\n  ".join(EXAMPLES),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except (ConfigError, PairMQError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
