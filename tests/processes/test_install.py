"""`pairmq install` and systemd/install.sh in a throwaway root, for each role.

The root gets a real /etc/passwd (useradd --root writes it), real files with modes and owners, units
enabled with `systemctl --root` (symlinks). The software is the venv these tests run in, linked into the
root at /opt/pairmq/venv and passed with --venv, except in the two tests that let the installer build the
venv with pip (this tree from the machine's local mirror; the run's wheel of it with the vip extra from pip's
configured index and cache).
systemd is not PID 1 here, so nothing is started: see docs/operations.md. What systemd would do with
LoadCredential= (hand the node a copy of the admin file in $CREDENTIALS_DIRECTORY) is done by hand for a
real node at the end.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pairmq.appliance.api.admin_credential import admin_path, new_credential, read_admin, write_admin
from pairmq.appliance.roles import Role
from pairmq.cli import install
from tests.harness.group import LOOPBACK, REPO, Group
from tests.harness.wheel import pure_wheel

VENV = Path(sys.executable).parent.parent  # the venv running these tests: has bin/pairmq
ADMIN_PASSWORD = "an admin password of some length"
GROUP = """\
[group]
name = "orders"
secret_file = "secret"
[nodes.primary]
address = "10.0.0.1"
[nodes.backup]
address = "10.0.0.2"
[nodes.monitor]
address = "10.0.0.3"
"""


@pytest.fixture
def root(tmp_path) -> Path:
    for tool in ("useradd", "systemctl", "systemd-analyze", "setpriv"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run .ci/setup (it installs passwd, systemd and util-linux)")
    if os.geteuid() != 0:
        pytest.fail("these tests install into a throwaway root with useradd --root and chown: run them as root")
    r = tmp_path / "root"
    (r / "etc").mkdir(parents=True)
    (r / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (r / "etc/group").write_text("root:x:0:\n")
    for name, line in (("shadow", "root:*:19000:0:99999:7:::\n"), ("gshadow", "root:*::\n")):
        (r / "etc" / name).write_text(line)
        (r / "etc" / name).chmod(0o640)
    (r / "opt/pairmq").mkdir(parents=True)
    (r / "opt/pairmq/venv").symlink_to(VENV)
    return r


@pytest.fixture
def source(tmp_path) -> Path:
    s = tmp_path / "src"
    s.mkdir()
    (s / "group.toml").write_text(GROUP)
    fd = os.open(s / "secret", os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, (b"ab" * 32) + b"\n")
    os.close(fd)
    write_admin(s / "admin", new_credential("admin", ADMIN_PASSWORD))  # what `pairmq init` writes beside it
    return s


def pairmq_install(root: Path, source: Path, *extra: str, via: str = "pairmq", role: str = "primary",
                   user: list[str] | None = None, env: dict | None = None,
                   group: bool = True) -> subprocess.CompletedProcess:
    command = [str(REPO / "systemd/install.sh")] if via == "install.sh" else [sys.executable, "-m", "pairmq.cli.main", "install"]
    argv = [*(user or []), *command, "--role", role, *(["--group", str(source / "group.toml")] if group else []),
            "--root", str(root), "--venv", "/opt/pairmq/venv", *extra]
    return subprocess.run(argv, capture_output=True, text=True, cwd=source, timeout=60, env=env)


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for path in sorted(root.rglob("*")):
        if "venv" in path.parts:
            continue
        st = path.lstat()
        content = path.read_bytes() if path.is_file() and not path.is_symlink() else os.readlink(path) if path.is_symlink() else None
        out[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, content)
    return out


def ids(root: Path) -> tuple[int, int]:
    user = next(line.split(":") for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("pairmq:"))
    return int(user[2]), int(user[3])


def mode_owner(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return oct(st.st_mode & 0o7777), st.st_uid, st.st_gid


def verify(unit_text: str, name: str, root: Path, tmp: Path) -> subprocess.CompletedProcess:
    """systemd-analyze verify on the installed unit, ExecStart pointed into the root (verify needs it to exist)."""
    tmp.mkdir(exist_ok=True)
    (tmp / name).write_text(unit_text.replace("/opt/pairmq/venv/", f"{root}/opt/pairmq/venv/"))
    instance = name.replace("@.service", "@primary.service")
    return subprocess.run(["/usr/bin/systemd-analyze", "verify", str(tmp / instance)], capture_output=True, text=True,
                          cwd=tmp, timeout=60)


@pytest.mark.parametrize("role", [r.value for r in Role])
def test_install_each_role_in_a_throwaway_root_then_again_changes_nothing(root, source, tmp_path, role):
    first = pairmq_install(root, source, via="install.sh", role=role)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    uid, gid = ids(root)
    assert uid != 0 and gid != 0
    assert "pairmq:" in (root / "etc/group").read_text()
    assert mode_owner(root / "etc/pairmq") == ("0o750", 0, gid)
    assert mode_owner(root / "etc/pairmq/group.toml") == ("0o640", 0, gid)
    assert mode_owner(root / "etc/pairmq/secret") == ("0o600", 0, 0)
    assert mode_owner(root / "etc/pairmq/admin") == ("0o600", 0, 0)  # the node's copy is a systemd credential
    assert (root / "etc/pairmq/admin").read_bytes() == (source / "admin").read_bytes()
    assert mode_owner(root / "var/lib/pairmq") == ("0o750", uid, gid)
    assert mode_owner(root / "var/log/pairmq") == ("0o750", uid, gid)
    assert (root / "etc/pairmq/group.toml").read_text() == GROUP
    assert (root / "etc/pairmq/secret").read_bytes() == (source / "secret").read_bytes()
    unit_file = "pairmq-monitor.service" if role == "monitor" else "pairmq@.service"
    unit = "pairmq-monitor.service" if role == "monitor" else f"pairmq@{role}.service"
    installed = root / "etc/systemd/system" / unit_file
    assert mode_owner(installed) == ("0o644", 0, 0)
    # the shipped unit, pointed at the docs this venv really holds: the work tree's in an editable install, the
    # venv's own copy, seen at /opt/pairmq/venv, in a regular one (.venv-pure's)
    shipped = (REPO / "systemd" / unit_file).read_text()
    docs = Path(str(importlib.resources.files("pairmq.docs").joinpath("operations.md")))
    docs = Path("/opt/pairmq/venv") / docs.relative_to(VENV) if docs.is_relative_to(VENV) else docs
    assert installed.read_text() == install.render_unit(shipped, Path("/opt/pairmq/venv"), docs)
    assert f"Documentation=file://{docs}\n" in installed.read_text()
    assert "LoadCredential=pairmq-admin:/etc/pairmq/admin\n" in installed.read_text()
    wants = root / "etc/systemd/system/multi-user.target.wants" / unit
    assert os.readlink(wants) == f"/etc/systemd/system/{unit_file}"
    assert not (root / f"etc/systemd/system/{unit}.d").exists()  # no [vip]: no capabilities

    checked = verify(installed.read_text(), unit_file, root, tmp_path / "verify")
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr

    before = snapshot(root)
    second = pairmq_install(root, source, via="pairmq", role=role)  # the other entry point: one implementation
    assert second.returncode == 0, second.stderr
    lines = second.stdout.splitlines()
    assert all(line.startswith("unchanged") for line in lines[:-1]), lines
    assert lines[-1] == f"nothing changed: this host was already installed as the {role}"
    assert snapshot(root) == before


def test_verify_check_can_fail(root, tmp_path):
    """The verify step above would catch a broken unit: a typo'd key and a missing ExecStart both show."""
    text = (REPO / "systemd/pairmq-monitor.service").read_text()
    typo = verify(text.replace("NoNewPrivileges=yes", "NoNewPrivilege=yes"), "pairmq-monitor.service", root, tmp_path / "a")
    assert "Unknown key 'NoNewPrivilege'" in typo.stderr
    missing = verify(text.replace("/opt/pairmq/venv/bin/pairmq", "/opt/pairmq/venv/bin/nope"), "pairmq-monitor.service",
                     root, tmp_path / "b")
    assert missing.returncode != 0 and "is not executable" in missing.stderr


def test_vip_drop_in_only_with_vip_and_removed_without(root, source, tmp_path):
    """[vip] is added to the group file's schema by the virtual-IP work; here the plan's `vip` is set as
    the group file's [vip] table sets it, and install() writes, verifies and later removes the drop-in."""
    plan = install.plan("backup", source / "group.toml", root=root, venv=Path("/opt/pairmq/venv"))
    assert plan.vip is False
    install.install(dataclasses.replace(plan, vip=True), say=lambda s: None)
    drop_in = root / "etc/systemd/system/pairmq@backup.service.d/vip.conf"
    assert mode_owner(drop_in) == ("0o644", 0, 0)
    assert "CAP_NET_ADMIN CAP_NET_RAW" in drop_in.read_text() and "AF_PACKET" in drop_in.read_text()
    merged = (root / "etc/systemd/system/pairmq@.service").read_text() + drop_in.read_text()
    checked = verify(merged, "pairmq@.service", root, tmp_path / "verify")
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr
    # systemd merges the drop-in's lists into the unit's: packet sockets and the two capabilities, no more
    assert packet_sockets_allowed(tmp_path / "verify") == "✗"
    verify((root / "etc/systemd/system/pairmq@.service").read_text(), "pairmq@.service", root, tmp_path / "plain")
    assert packet_sockets_allowed(tmp_path / "plain") == "✓"

    said = install.install(plan, say=lambda s: None)  # [vip] gone from the group file: capabilities gone too
    assert not drop_in.exists()
    assert "removed: /etc/systemd/system/pairmq@backup.service.d/vip.conf (the group file has no [vip] table)" in said


def packet_sockets_allowed(unit_dir: Path) -> str:
    """systemd-analyze security's mark for AF_PACKET: ✗ allowed, ✓ refused."""
    out = subprocess.run(["/usr/bin/systemd-analyze", "security", "--offline=yes", str(unit_dir / "pairmq@primary.service")],
                         capture_output=True, text=True, cwd=unit_dir, timeout=60).stdout
    [line] = [line for line in out.splitlines() if "RestrictAddressFamilies=~AF_PACKET" in line]
    return line.split()[0]


def _refused(root, source, *extra, role="primary", user=None, code=1, env=None, group=True) -> str:
    before = snapshot(root)
    done = pairmq_install(root, source, *extra, role=role, user=user, env=env, group=group)
    assert done.returncode == code, (done.stdout, done.stderr)
    assert snapshot(root) == before, "a refused install changed the root"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_refusals_are_one_sentence_and_change_nothing(root, source):
    assert "argument --role: invalid choice: 'mirror'" in _refused(root, source, role="mirror", code=2)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    assert "pairmq install must run as root" in _refused(root, source, user=nobody)

    group = source / "group.toml"
    group.rename(source / "elsewhere.toml")
    assert f"group file {group} does not exist" in _refused(root, source)
    group.write_text(GROUP + "[nodes.witness]\naddress = '10.0.0.4'\n")
    assert "unknown key 'witness' in [nodes]" in _refused(root, source)
    group.write_text(GROUP.replace("[nodes.monitor]\naddress = \"10.0.0.3\"\n", ""))
    assert "the group file needs a [nodes.monitor] table" in _refused(root, source, role="monitor")
    group.write_text(GROUP.replace('address = "10.0.0.2"', 'address = "10.0.0.2"\ndata_dir = "/srv/pairmq"'))
    assert "nodes.backup.data_dir is '/srv/pairmq'; under systemd it must be /var/lib/pairmq" in _refused(
        root, source, role="backup")
    group.write_text(GROUP)

    (source / "secret").chmod(0o644)
    assert "is readable by others (mode 644)" in _refused(root, source)
    (source / "secret").chmod(0o600)
    (source / "short").write_text("abcd\n")
    (source / "short").chmod(0o600)
    assert "is too short" in _refused(root, source, "--secret", str(source / "short"))
    assert "--venv /opt/nothing has no executable bin/pairmq" in _refused(root, source, "--venv", "/opt/nothing")
    done = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "install", "--role", "monitor", "--group",
                           str(source / "group.toml"), "--root", "relative/root"], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip() == (
        "error: --root relative/root must be an existing directory, given as an absolute path")


def test_changed_group_file_and_secret_are_replaced_and_said(root, source):
    assert pairmq_install(root, source, role="monitor").returncode == 0
    (source / "group.toml").write_text(GROUP.replace('name = "orders"', 'name = "orders"\nauto_revert = true'))
    (source / "secret").write_bytes(b"cd" * 32 + b"\n")
    again = pairmq_install(root, source, role="monitor")
    assert again.returncode == 0, again.stderr
    uid, gid = ids(root)
    changed = [line for line in again.stdout.splitlines() if not line.startswith("unchanged")]
    assert changed == ["changed: /etc/pairmq/group.toml (0640, root:pairmq)",
                       "changed: /etc/pairmq/secret (0600, root:root)"]
    assert (root / "etc/pairmq/group.toml").read_text() == (source / "group.toml").read_text()
    assert (root / "etc/pairmq/secret").read_bytes() == b"cd" * 32 + b"\n"
    assert mode_owner(root / "etc/pairmq/secret") == ("0o600", 0, 0)
    assert [p.name for p in (root / "etc/pairmq").iterdir() if p.name.startswith(".")] == []  # no temp files left


def test_the_roles_address_must_be_this_hosts():
    """Installed on / (never here: it would change this machine), the role's address must be local, so a
    host installed with another host's role is refused before anything changes."""
    assert install.address_is_local(LOOPBACK[Role.PRIMARY])
    assert not install.address_is_local("192.0.2.1")  # TEST-NET-1: on no host


LOCAL_INDEX = Path("/opt/pypi/simple")  # this machine's local package mirror (file://, no network)


@pytest.mark.timeout(900)  # pip builds and installs: minutes on a loaded machine
def test_venv_is_built_with_pip_after_pip_said_it_could(root, source, tmp_path):
    """The default software step: `python -m venv /opt/pairmq/venv`, then pip installs this source tree.
    Before anything changes pip resolves it (--dry-run, in a scratch venv): without any index it cannot
    get the build requirements (setuptools, wheel), which is one sentence naming pip's reason and a root
    left exactly as it was. Given the local mirror (dependencies left out: the mirror need not hold them
    all), it builds the venv, and a second run takes it for done."""
    if not (LOCAL_INDEX / "setuptools").is_dir() or not (LOCAL_INDEX / "wheel").is_dir():
        pytest.fail(f"{LOCAL_INDEX} has no setuptools or wheel: this test needs the machine's local package mirror")
    (root / "opt/pairmq/venv").unlink()
    # pip builds a local tree in place (build/, *.egg-info): give it a copy, not this work tree
    tree = tmp_path / "pairmq-src"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "*.egg-info", "__pycache__",
                                                              ".pytest_cache", ".hypothesis", "local", "node_modules",
                                                              "*.so"))
    command = [sys.executable, "-m", "pairmq.cli.main", "install", "--role", "primary", "--group", str(source / "group.toml"),
               "--root", str(root), "--package", str(tree)]
    before = snapshot(root)
    failed = subprocess.run([*command, "--pip-option=--no-index"], capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1, failed.stdout
    [line] = failed.stderr.strip().splitlines()
    assert line == (f"error: pip would not install {tree} into /opt/pairmq/venv: "
                    "ERROR: No matching distribution found for setuptools>=68"), line
    assert snapshot(root) == before, "a refused install changed the root"
    assert not (root / "opt/pairmq/venv").exists() and not (root / "etc/pairmq").exists()
    assert "pairmq:" not in (root / "etc/passwd").read_text()

    # Uncompiled (docs/build.md): the mirror need not hold the compiler either.
    built = subprocess.run([*command, "--pip-option=--no-deps", f"--pip-option=--index-url=file://{LOCAL_INDEX}"],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "PAIRMQ_PURE_PYTHON": "1"})
    assert built.returncode == 0, built.stderr
    assert f"built: /opt/pairmq/venv with {tree}" in built.stdout.splitlines()
    venv = root / "opt/pairmq/venv"
    installed = subprocess.run([str(venv / "bin/python"), "-c", "import pairmq.appliance.config as c; print(c.__file__)"],
                               capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert installed.stdout.startswith(str(venv / "lib")), installed  # a copy in the venv, not this work tree
    assert os.access(venv / "bin/pairmq", os.X_OK)
    unit = (root / "etc/systemd/system/pairmq@.service").read_text()
    [docs] = [line.removeprefix("Documentation=file://") for line in unit.splitlines() if line.startswith("Documentation=")]
    assert docs.startswith("/opt/pairmq/venv/lib/python3.") and docs.endswith("/site-packages/pairmq/docs/operations.md")
    assert (root / docs.lstrip("/")).read_text() == (tree / "docs/operations.md").read_text()  # where it really lands
    checked = verify(unit, "pairmq@.service", root, tmp_path / "v")
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.stdout.splitlines()[-1] == "nothing changed: this host was already installed as the primary"


def read_as_service_user(root: Path, name: str) -> subprocess.CompletedProcess:
    """Read /etc/pairmq/<name> in a process running as the pairmq user and group (no other groups), as the
    unit runs the node; through a directory descriptor, since the throwaway root's own parents are root's."""
    uid, gid = ids(root)
    fd = os.open(root / "etc/pairmq", os.O_RDONLY | os.O_DIRECTORY)
    try:
        return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", sys.executable, "-c",
                               f"import os, sys; sys.stdout.buffer.write(os.read(os.open({name!r}, os.O_RDONLY, "
                               f"dir_fd={fd}), 1 << 16))"], capture_output=True, pass_fds=(fd,), timeout=30)
    finally:
        os.close(fd)


def test_the_admin_credential_is_root_only_and_reaches_the_node_as_a_systemd_credential(root, source):
    assert pairmq_install(root, source, role="backup").returncode == 0
    assert read_as_service_user(root, "admin").returncode != 0  # root's file, like the secret
    assert read_as_service_user(root, "secret").returncode != 0
    for name in ("pairmq@.service", ):
        unit = (root / "etc/systemd/system" / name).read_text()
        assert "LoadCredential=pairmq-admin:/etc/pairmq/admin\n" in unit
    # `pairmq admin passwd` run by root over the installed file keeps it root's
    write_admin(root / "etc/pairmq/admin", new_credential("admin", "a new admin password here"))
    assert mode_owner(root / "etc/pairmq/admin") == ("0o600", 0, 0)
    assert read_admin(root / "etc/pairmq/admin").username == "admin"


def test_a_node_reads_the_admin_credential_from_credentials_directory(tmp_path):
    """What systemd does for LoadCredential=pairmq-admin: a copy in $CREDENTIALS_DIRECTORY, which the node
    reads instead of the file beside the secret (that one may be root's only)."""
    with Group(tmp_path / "group") as g:
        write_admin(admin_path(g.config), new_credential("admin", "the file beside the secret"))
        creds = tmp_path / "credentials"
        creds.mkdir()
        write_admin(creds / "pairmq-admin", new_credential("admin", "the credential systemd passed"))
        g.start(Role.MONITOR, wrap=("env", f"CREDENTIALS_DIRECTORY={creds}"))
        url = f"http://{g.address(Role.MONITOR)}:{g.config.ports.management}/api/v1/redundancy"
        g.wait_for("the monitor's API", lambda: basic_status(url, "the credential systemd passed") == 200, timeout_s=20)
        assert basic_status(url, "the file beside the secret") == 401


def basic_status(url: str, password: str) -> int:
    import base64
    import urllib.error
    import urllib.request

    auth = "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": auth}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # not listening yet
        return 0


def test_without_an_admin_credential_install_refuses_and_changes_nothing(root, source):
    (source / "admin").unlink()
    assert "no admin credential at" in _refused(root, source)


def test_the_management_certificate_and_key_are_installed_beside_the_group_file(root, source):
    from pairmq.appliance.management_settings import make_self_signed

    make_self_signed(source / "management.pem", source / "management.key", ["10.0.0.1", "10.0.0.2", "10.0.0.3"], "o")
    (source / "group.toml").write_text(GROUP + '[management]\ncert_file = "management.pem"\nkey_file = "management.key"\n')
    done = pairmq_install(root, source, role="monitor")
    assert done.returncode == 0, done.stderr
    uid, gid = ids(root)
    assert mode_owner(root / "etc/pairmq/management.pem") == ("0o644", 0, 0)
    assert mode_owner(root / "etc/pairmq/management.key") == ("0o640", 0, gid)
    assert read_as_service_user(root, "management.key").stdout == (source / "management.key").read_bytes()


def test_json_reports_each_step_and_whether_anything_changed(root, source):
    first = pairmq_install(root, source, "--json", role="monitor")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert (doc["role"], doc["unit"], doc["venv"], doc["changed"]) == (
        "monitor", "pairmq-monitor.service", "/opt/pairmq/venv", True)
    assert {"outcome": "created", "detail": "/etc/pairmq/admin (0600, root:root)"} in doc["steps"]
    again = json.loads(pairmq_install(root, source, "--json", role="monitor").stdout)
    assert again["changed"] is False
    assert again["steps"][-1] == {"outcome": "nothing changed",
                                  "detail": "this host was already installed as the monitor"}


def test_the_group_file_comes_from_pairmq_group_as_for_every_command(root, source):
    env = {**os.environ, "PAIRMQ_GROUP": str(source / "group.toml")}
    done = pairmq_install(root, source, role="backup", env=env, group=False)
    assert done.returncode == 0, done.stderr
    assert (root / "etc/pairmq/group.toml").read_text() == GROUP
    # without either, /etc/pairmq/group.toml of this host (none here): refused, nothing changed
    env.pop("PAIRMQ_GROUP")
    assert "group file /etc/pairmq/group.toml does not exist" in _refused(
        root, source, role="backup", env=env, group=False)


def test_a_venv_without_the_vip_extra_is_refused_for_a_vip_group(root, source, tmp_path):
    """A routing node of a group with [vip] needs pyroute2 and scapy in the venv that runs it; the monitor
    never holds the address, so it does not."""
    prefix = root / "opt/novip"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin/pairmq").write_text("#!/bin/sh\n")
    (prefix / "bin/pairmq").chmod(0o755)
    (prefix / "bin/python").symlink_to(shutil.which("python3", path="/usr/bin:/bin"))  # the system's: no pyroute2
    assert subprocess.run([str(prefix / "bin/python"), "-c", "import pyroute2"], capture_output=True).returncode != 0
    (source / "group.toml").write_text(GROUP + '[vip]\naddress = "10.0.0.100/24"\ninterface = "eth0"\n')
    assert _refused(root, source, "--venv", "/opt/novip", role="backup") == (
        "error: --venv /opt/novip lacks the vip extra the group file's [vip] needs: "
        "run /opt/novip/bin/pip install 'pairmq[vip]'")
    done = pairmq_install(root, source, "--venv", "/opt/novip", role="monitor")
    assert done.returncode == 0, done.stderr


def test_paths_that_cannot_be_written_are_refused_before_anything_changes(root, source):
    (root / "var/log").mkdir(parents=True)
    (root / "var/log/pairmq").write_text("a file where the log directory goes\n")
    assert _refused(root, source) == "error: /var/log/pairmq exists and is not a directory"


def test_a_pairmq_without_its_unit_files_is_refused_before_anything_changes(root, source, tmp_path):
    """As systemd/install.sh runs it (the packages linked under pairmq/), but with no systemd/ beside them:
    a broken installation is found by the checks, not half-way through."""
    shim = tmp_path / "shim"
    (shim / "pairmq").mkdir(parents=True)
    for part in ("appliance", "mate_link", "configsync", "monitor", "cli", "analytics", "docs"):
        (shim / "pairmq" / part).symlink_to(REPO / part)
    before = snapshot(root)
    system_python = shutil.which("python3", path="/usr/bin:/bin")  # install.sh's: no pairmq of its own
    done = subprocess.run([system_python, "-m", "pairmq.cli.install", "--role", "monitor", "--group",
                           str(source / "group.toml"), "--root", str(root), "--venv", "/opt/pairmq/venv"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(shim)})
    assert done.returncode == 1, done.stdout
    assert done.stderr.strip() == ("error: the unit file pairmq-monitor.service is missing from this installation "
                                   "of pairmq (package pairmq.systemd): reinstall pairmq")
    assert snapshot(root) == before


@pytest.mark.timeout(900)  # pip builds and installs: minutes on a loaded machine
def test_a_routing_host_of_a_vip_group_gets_the_vip_extra_in_its_venv(root, source, tmp_path):
    """The venv is built with `pairmq[vip]` (pyroute2, scapy) when the group file has [vip]: the
    dependencies come from pip's configured index and cache, as on a host. The package is the run's wheel of
    this tree (tests/harness/wheel.py): building from a source tree is the test above's."""
    (root / "opt/pairmq/venv").unlink()
    wheel = pure_wheel()
    (source / "group.toml").write_text(GROUP + '[vip]\naddress = "10.0.0.100/24"\ninterface = "eth0"\n')
    built = subprocess.run([sys.executable, "-m", "pairmq.cli.main", "install", "--role", "backup", "--group",
                            str(source / "group.toml"), "--root", str(root), "--package", str(wheel)],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    assert f"built: /opt/pairmq/venv with {wheel}[vip]" in built.stdout.splitlines()
    venv = root / "opt/pairmq/venv"
    imported = subprocess.run([str(venv / "bin/python"), "-c", "import pyroute2, scapy, paho.mqtt"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert imported.returncode == 0, imported.stderr
    assert (root / "etc/systemd/system/pairmq@backup.service.d/vip.conf").is_file()
