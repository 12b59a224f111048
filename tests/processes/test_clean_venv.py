"""What a stranger gets from `pip install`: the wheel of this tree in a fresh virtualenv, then as an operator.

The wheel is the run's one wheel of this tree (tests/harness/wheel.py: uncompiled, from a copy of the tree).
The base install resolves the wheel's own dependencies into a venv that starts empty (no system site-packages),
so what is in it afterwards is exactly the base dependencies' closure: the test checks that no extra's package
came along, then runs `pairmq pub` and `pairmq sub` from that venv against a real group. pip's cache makes the
installs quick after the first run. The analytics extra is then added to the same venv and `analytics summarize`
runs over the group's own event logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pairmq.appliance.roles import Role
from tests.harness.group import REPO, active_group
from tests.harness.wheel import pure_wheel

# Building the wheel, resolving the venvs and a first Spark session take minutes on a loaded machine: the
# default per-test timeout is for tests that only start nodes.
pytestmark = [pytest.mark.processes, pytest.mark.timeout(1200)]

EXTRA_PACKAGES = {"pyspark", "pyarrow", "pandas", "matplotlib", "pyroute2", "scapy", "pytest", "mypy"}


@pytest.fixture(scope="module")
def wheel() -> Path:
    return pure_wheel()


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh venv with the wheel and its base dependencies only."""
    v = tmp_path_factory.mktemp("clean") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(v)], check=True, timeout=120)
    done = pip(v, "install", "--quiet", str(wheel))
    assert done.returncode == 0, done.stderr[-3000:]
    return v


def pip(v: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(v / "bin/python"), "-m", "pip", *args], capture_output=True, text=True, timeout=900)


def pairmq(v: Path, *args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    # cwd away from the work tree and no PYTHONPATH: nothing but the venv's own copy can be imported
    env = {k: val for k, val in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(v / "bin/pairmq"), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=env)


def installed(v: Path) -> set[str]:
    done = pip(v, "list", "--format=json")
    assert done.returncode == 0, done.stderr
    return {p["name"].lower() for p in json.loads(done.stdout)}


VIP_GROUP = """\
[group]
name = "vip"
secret_file = "secret"
[nodes.primary]
address = "10.0.0.1"
[nodes.backup]
address = "10.0.0.2"
[nodes.monitor]
address = "10.0.0.3"
[vip]
address = "10.0.0.100/24"
interface = "eth0"
"""


def test_the_base_install_runs_pub_and_sub_and_names_the_extras_it_lacks(venv, tmp_path):
    have = installed(venv)
    assert "pairmq" in have and "paho-mqtt" in have
    assert have.isdisjoint(EXTRA_PACKAGES), have & EXTRA_PACKAGES  # the base dependencies alone
    where = subprocess.run([str(venv / "bin/python"), "-c", "import pairmq.cli.hostlist as m; print(m.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert where.stdout.startswith(str(venv / "lib")), where  # the wheel's copy, not this work tree

    helped = pairmq(venv, "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "analytics" in helped.stdout and "install" in helped.stdout, helped.stderr

    with active_group(tmp_path / "group") as g:
        host = g.address(Role.PRIMARY)
        sent = pairmq(venv, "pub", "--hosts", host, "-t", "clean/venv", "-m", "hello", "-r", cwd=tmp_path)
        assert sent.returncode == 0, sent.stderr
        got = pairmq(venv, "sub", "--hosts", host, "-t", "clean/#", "-v", "-C", "1", "-W", "20", cwd=tmp_path)
        assert (got.returncode, got.stdout) == (0, "clean/venv hello\n"), got.stderr

    install_from_the_wheel(venv, tmp_path)

    refused = pairmq(venv, "analytics", "summarize", str(g.dir / "data"), cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: pairmq analytics needs the analytics extra (") and line.endswith(
        "not installed): run pip install 'pairmq[analytics]'"), line

    (tmp_path / "vip").mkdir()
    (tmp_path / "vip/group.toml").write_text(VIP_GROUP)
    no_vip = pairmq(venv, "node", "--role", "backup", "--group", str(tmp_path / "vip/group.toml"), cwd=tmp_path)
    assert no_vip.returncode == 2, no_vip.stdout
    assert no_vip.stderr.strip() == ("error: the virtual IP ([vip] in the group file) needs the vip extra "
                                     "(pyroute2, scapy not installed): run pip install 'pairmq[vip]'")


def test_the_analytics_extra_makes_summarize_work(venv, wheel, tmp_path):
    done = pip(venv, "install", "--quiet", f"{wheel}[analytics]")
    assert done.returncode == 0, done.stderr[-3000:]
    assert {"pyspark", "pyarrow", "matplotlib"} <= installed(venv)
    with active_group(tmp_path / "group") as g:
        host = g.address(Role.PRIMARY)
        # a persistent session that then goes away: the three QoS 1 messages are queued for it, then delivered
        fleet = ("sub", "--hosts", host, "-c", "-i", "fleet", "-t", "plant/#", "-v")
        pairmq(venv, *fleet, "-W", "1", cwd=tmp_path)
        for i in range(3):
            sent = pairmq(venv, "pub", "--hosts", host, "-t", f"plant/{i}", "-m", "x" * 16, cwd=tmp_path)
            assert sent.returncode == 0, sent.stderr
        got = pairmq(venv, *fleet, "-C", "3", "-W", "5", cwd=tmp_path)  # what it prints is the base test's
        assert got.returncode == 0, got.stderr
    view = pairmq(venv, "analytics", "summarize", str(g.dir / "data"), "--json", cwd=tmp_path, timeout=600)
    assert view.returncode == 0, view.stderr[-3000:]
    summary = json.loads(view.stdout)
    assert summary["malformed_lines"] == 0
    assert summary["messages"]["published_per_node"]["primary"] == 3
    assert {r["topic"]: r["messages"] for r in summary["top_topics"]} == {f"plant/{i}": 1 for i in range(3)}


def install_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    """`pairmq init`, then `pairmq install` of the pip-installed package into a throwaway root: the units are
    the wheel's package data, and Documentation= names the docs the wheel put into that venv."""
    made = pairmq(venv, "init", "--dir", str(tmp_path / "orders"), "--name", "orders", "--primary", "10.0.0.1",
                  "--backup", "10.0.0.2", "--monitor", "10.0.0.3", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\n")
    for name, line in (("shadow", "root:*:19000:0:99999:7:::\n"), ("gshadow", "root:*::\n")):
        (root / "etc" / name).write_text(line)
    (root / "opt/pairmq").mkdir(parents=True)
    (root / "opt/pairmq/venv").symlink_to(venv)
    done = pairmq(venv, "install", "--role", "backup", "--group", str(tmp_path / "orders/group.toml"), "--root",
                  str(root), "--venv", "/opt/pairmq/venv", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["changed"] is True
    unit = (root / "etc/systemd/system/pairmq@.service").read_text()
    assert unit.startswith((REPO / "systemd/pairmq@.service").read_text().split("[Unit]")[0])  # the shipped one
    [docs] = [line.removeprefix("Documentation=file://") for line in unit.splitlines() if line.startswith("Documentation=")]
    assert docs.endswith("/site-packages/pairmq/docs/operations.md"), docs
    # as the target host sees it: under /opt/pairmq/venv (the root's link to this venv), or this venv itself
    seen = root / docs.lstrip("/") if docs.startswith("/opt/pairmq/venv/") else Path(docs)
    assert seen.resolve().is_relative_to(venv.resolve())
    assert seen.read_text() == (REPO / "docs/operations.md").read_text()
