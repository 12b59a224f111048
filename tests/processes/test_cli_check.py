"""`pairmq check` as a monitoring system runs it, against a live group that loses its nodes one by one:
exit 0 OK, 1 WARNING (a node gone, redundancy down), 2 CRITICAL (nobody active), 3 UNKNOWN (nobody
answers), one status line each; and the planned handovers with `--json`."""

from __future__ import annotations

import json
import subprocess

from pairmq.appliance.roles import Role
from pairmq.cli import api
from pairmq.cli.local import _redundant
from tests.harness.group import active_group
from tests.processes.test_cli_conventions import run

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR


def check(g) -> subprocess.CompletedProcess:
    return run(g, "check", timeout=30)


def test_check_exit_codes_as_the_group_loses_its_nodes(tmp_path):
    with active_group(tmp_path / "group") as g:
        ok = check(g)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.startswith("PAIRMQ OK - group 'test': primary active (epoch ")
        assert "redundancy Up, configuration in sync |" in ok.stdout and ok.stdout.count("\n") == 1
        document = json.loads(run(g, "check", "--json").stdout)
        assert document["state"] == "OK" and document["exit_code"] == 0 and len(document["nodes"]) == 3

        handed = run(g, "redundancy", "release-activity", "--json")
        assert handed.returncode == 0, handed.stderr
        document = json.loads(handed.stdout)
        assert document["ok"] and document["result"] == "handed over" and document["node"] == "primary"
        g.wait_for("the primary to be the backup's in-sync standby",
                   lambda: _redundant(api.fetch_redundancy(g.config)), timeout_s=30)
        result = run(g, "redundancy", "revert-activity", "--json")
        reverted = json.loads(result.stdout)
        assert reverted.get("result") == "handed over" and reverted["node"] == "backup", result.stdout
        g.wait_for("the primary to serve", lambda: g.serving(P), timeout_s=30)

        g.kill(B)
        g.wait_for("check to warn", lambda: check(g).returncode == 1, timeout_s=30)
        warning = check(g)
        assert warning.stdout.startswith("PAIRMQ WARNING - group 'test': primary active"), warning.stdout
        assert "backup not answering" in warning.stdout

        g.kill(P)
        g.wait_for("check to be critical", lambda: check(g).returncode == 2, timeout_s=30)
        assert check(g).stdout.startswith("PAIRMQ CRITICAL - group 'test': no node holds activity")

        g.kill(M)
        g.wait_for("check to know nothing", lambda: check(g).returncode == 3, timeout_s=30)
        unknown = check(g)
        assert unknown.stdout.startswith("PAIRMQ UNKNOWN - no node of group 'test' answered")
        assert unknown.stderr == ""


def test_local_up_ends_on_the_redundant_group_not_on_a_half_started_one(tmp_path):
    """What `pairmq local up` does once a node serves (it runs the group on fixed addresses; this is the same
    wait against a group on this test's own): it returns the view with the standby joined and in sync."""
    from io import StringIO

    from rich.console import Console

    from pairmq.cli import api
    from pairmq.cli.local import _redundant, _wait_redundant
    from pairmq.cli.terminal import Terminal
    from tests.harness.group import Group

    with Group(tmp_path / "group") as g:
        g.start()
        g.wait_for("a node to serve", lambda: any(n.get("serving") for n in api.fetch_redundancy(g.config)),
                   timeout_s=30, every_s=0.05)
        err = StringIO()
        nodes = _wait_redundant(Terminal(Console(file=StringIO()), Console(file=err)), g.config,
                                api.fetch_redundancy(g.config))
        assert _redundant(nodes) and err.getvalue() == "", err.getvalue()
        standby = next(n for n in nodes if n["role"] == "backup")
        assert standby["in_sync"] is True and standby["activity"] in ("Mate Active", "Standby")
