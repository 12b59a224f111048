"""`pairmq events follow` and `pairmq show redundancy --watch` as a person runs them: the real console
script in a subprocess against a real group (a pseudo-terminal for --watch, so Rich redraws live)."""

from __future__ import annotations

import json
import os
import pty
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from pairmq.appliance.roles import Role
from pairmq.cli import api
from pairmq.cli.events_cmd import line
from tests.harness.group import REPO, Group, active_group
from tests.harness.http_api import hand_over

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR
LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}  (primary|backup |monitor)  (\S+) +epoch (\d+) +(.+)")


def env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "PAIRMQ_GROUP"}


def as_at_a_terminal() -> None:
    """A child's Ctrl-C as at a terminal: a suite started from a script's background job ignores SIGINT, and
    its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pairmq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=env())


class Tail:
    """`pairmq events follow ...` running; its stdout lines arrive on a queue."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "pairmq.cli.main", "events", "follow", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env(),
                                     preexec_fn=as_at_a_terminal)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for out in self.proc.stdout:
            self.lines.put(out.rstrip("\n"))
        self.lines.put(None)

    def next(self, timeout_s: float = 20.0) -> str | None:
        return self.lines.get(timeout=timeout_s)

    def until(self, predicate, timeout_s: float = 20.0) -> str:
        deadline = time.monotonic() + timeout_s
        seen = []
        while time.monotonic() < deadline:
            try:
                got = self.next(max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            assert got is not None, f"the tail ended first; it printed {seen}; stderr: {self.proc.stderr.read()}"
            seen.append(got)
            if predicate(got):
                return got
        raise AssertionError(f"no such line in {seen}")

    def interrupt(self, sig: int = signal.SIGINT) -> tuple[int, str]:
        self.proc.send_signal(sig)
        code = self.proc.wait(15)
        return code, self.proc.stderr.read()


def test_a_decision_line_is_exact():
    decision = {"id": "3-7", "seq": 7, "node": "backup", "kind": "activate", "epoch": 2,
                "reason": "backup: primary unseen 0.60 s, monitor concurs, in sync → taking activity, epoch 2",
                "at": "2026-11-22T22:40:00.123Z"}
    assert line(decision) == ("2026-11-22 22:40:00.123  backup   activate     epoch 2   primary unseen 0.60 s, "
                              "monitor concurs, in sync → taking activity, epoch 2")
    assert line({**decision, "reason": "no prefix here"}).endswith("epoch 2   no prefix here")


def test_events_tail_says_in_one_sentence_that_no_node_answers(tmp_path):
    with Group(tmp_path) as g:  # written, never started: nothing listens on the group's addresses
        urls = {r: api.base_url(g.config, r) for r in Role}
        refused = "connection refused (is the node running?)"
        result = pairmq("events", "follow", "--group", str(tmp_path / "group.toml"))
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr == (f"error: no node of group 'test' answered (primary at {urls[P]}: {refused}; "
                                 f"backup at {urls[B]}: {refused}; monitor at {urls[M]}: {refused})\n")
        result = pairmq("events", "follow", "--node", "backup", "--group", str(tmp_path / "group.toml"))
        assert result.returncode == 1
        assert result.stderr == f"error: the backup node did not answer (backup at {urls[B]}: {refused})\n"
    for bad, sentence in ((["--lines", "x"], "--lines takes a whole number from 0 to 64, not 'x'"),
                          (["--lines", "65"], "--lines takes a whole number from 0 to 64, not '65'"),
                          (["--node", "arbiter"], "invalid choice: 'arbiter'")):
        result = pairmq("events", "follow", *bad)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and sentence in result.stderr, result


@pytest.mark.processes
def test_events_tail_follows_decisions_as_they_happen_and_stops_cleanly(tmp_path):
    with active_group(tmp_path) as g:
        group = str(tmp_path / "group.toml")
        tail = Tail("--lines", "3", "--group", group)
        backlog = [tail.next() for _ in range(3)]
        assert all(LINE.fullmatch(x) for x in backlog), backlog
        assert sorted(x[:23] for x in backlog) == [x[:23] for x in backlog]  # oldest first, by when nodes decided

        assert hand_over(g.config, P)["result"] == "handed over"
        activate = tail.until(lambda x: " backup " in x and " activate " in x)
        assert LINE.fullmatch(activate)[3] == "2" and "taking activity" in activate
        code, stderr = tail.interrupt()
        assert code == 0 and stderr == "", stderr

        # --json, one node: exactly the stream's objects, one per line. The one backlog line is printed only
        # once the stream is live, so the revert below is surely news (with --lines 0 nothing would say when
        # the stream went live, and a decision made before that counts as backlog).
        tail = Tail("--json", "--node", "backup", "--lines", "1", "--group", group)
        last_before = json.loads(tail.next())
        assert hand_over(g.config, B, "revert-activity")["result"] == "handed over"
        step_down = json.loads(tail.until(lambda x: '"step_down"' in x))
        assert step_down["seq"] > last_before["seq"]
        assert set(step_down) == {"id", "seq", "node", "kind", "epoch", "reason", "at"}
        assert step_down["node"] == "backup" and step_down["epoch"] == 2 and "handing activity over" in step_down["reason"]
        code, stderr = tail.interrupt(signal.SIGTERM)  # as `timeout` or systemd stop it: as clean as Ctrl-C
        assert code == 0 and stderr == ""

        # The followed node stops: its stream ends, and so does the tail, with a note.
        tail = Tail("--node", "monitor", "--lines", "1", "--group", group)
        assert LINE.fullmatch(tail.next())
        g.signal(M, signal.SIGTERM)
        assert tail.next(30) is None
        assert tail.proc.wait(15) == 0
        assert tail.proc.stderr.read() == "the monitor node's decision stream ended: the stream ended\n"


@pytest.mark.processes
def test_show_redundancy_watch_redraws_in_a_terminal_until_ctrl_c(tmp_path):
    with active_group(tmp_path) as g:
        leader, follower = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "pairmq.cli.main", "show", "redundancy", "--watch",
                                 "--group", str(tmp_path / "group.toml")],
                                stdin=follower, stdout=follower, stderr=follower, cwd=REPO,
                                env={**env(), "COLUMNS": "160", "LINES": "40", "TERM": "xterm"},
                                preexec_fn=as_at_a_terminal)
        os.close(follower)
        output = b""
        deadline = time.monotonic() + 4.5
        while time.monotonic() < deadline or not output:
            if select.select([leader], [], [], 0.2)[0]:
                output += os.read(leader, 65536)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        with_rest = output
        while select.select([leader], [], [], 0.2)[0]:
            try:
                with_rest += os.read(leader, 65536)
            except OSError:
                break
        os.close(leader)
        text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", with_rest).decode(errors="replace")
        assert text.count("Group test: redundancy") >= 2, text[-2000:]
        refreshed = set(re.findall(r"refreshed (\d\d:\d\d:\d\d) every 1 s", text))
        assert len(refreshed) >= 2, f"the table was not refreshed with new data: {refreshed}"
        assert "Local Active" in text and "Traceback" not in text
        assert g.address(P) in text
