"""`pairmq secret rotate` on a live group of real node processes (appliance/keyring.py, cli/secret_cmd.py).

What must hold: activity never moves because of a rotation (epochs and decisions unchanged while a
QoS 1 publisher streams), no heartbeat is rejected, the mate link and config-sync keep working and
re-handshake with the new key, a node with only the old secret is refused afterwards, a restart of
each role mid-rotation resumes in the step it persisted, and bad inputs change nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pairmq.appliance.keyring import Keyring
from pairmq.appliance.keyring import management_token
from pairmq.appliance.roles import Role
from tests.harness.config_api import call, change
from tests.harness.group import REPO, active_group
from tests.harness.streams import Publisher, Subscriber, check

P, B, M = Role.PRIMARY, Role.BACKUP, Role.MONITOR


def cli(g, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pairmq.cli.main", "secret", *args, "--group", str(g.dir / "group.toml")]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)


def show_secret(g, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pairmq.cli.main", "show", "secret", *args, "--group", str(g.dir / "group.toml")]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)


def api(g, role: Role, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    return call(g, role, path, body, token=token or True)


def view(g, role: Role) -> dict:
    """The redundancy view, read with the secret file's token, else with a token the test handed a node
    it started on another secret (`g.other_tokens`: every route needs a credential)."""
    for token in [None, *getattr(g, "other_tokens", [])]:
        status, reply = api(g, role, "/api/v1/redundancy", token=token)
        if status != 401:
            break
    assert status == 200, reply
    return reply


def keys_of(g, role: Role) -> tuple[list[int], int]:
    status, reply = api(g, role, "/api/v1/secret")
    assert status == 200, reply
    return reply["key_ids"], reply["send_key_id"]


def keys(g) -> dict[Role, tuple[list[int], int]]:
    return {r: keys_of(g, r) for r in Role}


def moves(g) -> dict[Role, int]:
    """How many activations and step-downs each node has logged (a rotation must add none)."""
    return {r: len([d for d in g.decisions(r) if d["kind"] in ("activate", "step_down")]) for r in Role}


def bad_macs(g) -> dict[Role, int]:
    """Each node's bad_mac rejections; -1 for a node not answering yet (polled while one starts)."""
    out = {}
    for r in Role:
        try:
            out[r] = view(g, r)["rejected_heartbeats"]["bad_mac"]
        except OSError:
            out[r] = -1
    return out


def file_ring(g) -> Keyring:
    return Keyring.from_text((g.dir / "secret").read_text(), "secret")


def dial_as_standby(g, port: int, ring: Keyring, purpose: str) -> str:
    """One handshake as the backup with `ring`'s send key: "closed" if the active refuses our HELLO."""
    import socket

    from pairmq.mate_link.secure import StandbyHandshake

    handshake = StandbyHandshake(ring, g.config.name, B, os.urandom(32), purpose)
    with socket.create_connection((g.address(P), port), timeout=5) as s:
        s.sendall(handshake.data_to_send())
        try:
            data = s.recv(4096)
        except ConnectionResetError:
            return "closed"
    return "closed" if not data else "challenged"


def sees_both(g, role: Role) -> bool:
    """Polled while a node starts: not answering yet is False."""
    try:
        return all(p["seen"] for p in view(g, role)["peers"])
    except OSError:  # URLError included
        return False


def test_rotation_under_qos1_traffic_never_moves_activity_and_old_secret_is_refused_after(tmp_path):
    with active_group(tmp_path / "group") as g:
        old = file_ring(g)
        assert old.view() == {"key_ids": [0], "send_key_id": 0}
        before = {r: view(g, r) for r in Role}
        moved = moves(g)
        hosts = [g.address(P), g.address(B)]
        sub = Subscriber("rot-sub", hosts)
        sub.start()
        pub = Publisher("rot-pub", hosts, 1, 1500, interval_s=0.004)
        pub.start()
        g.wait_for("the publisher to get going", lambda: len(pub.acked_now()) > 100, timeout_s=20)
        result = cli(g, "rotate")
        assert result.returncode == 0, result.stderr
        during = len(pub.acked_now())
        assert not pub.done_publishing(), "the rotation must run while the publisher streams: raise the count"
        g.wait_for("every QoS 1 message to be acknowledged", pub.all_acked, timeout_s=90)
        g.wait_for("the subscriber to receive them", lambda: len({s for _, s, _ in sub.snapshot()}) >= 1500,
                   timeout_s=30)
        report = check("rotation", [pub], [sub])
        pub.stop()
        sub.stop()
        assert report.lost == 0 and report.order_violations == 0, report

        # Progress, in order monitor, standby, active, for each of the three steps.
        lines = result.stderr.splitlines()
        for n, name in ((1, "add key id 1"), (2, "use key id 1"), (3, "retire key id 0")):
            done = [line for line in lines if line.startswith(f"step {n}/3 ({name}): ")]
            assert [line.split(": ")[1] for line in done] == ["monitor", "backup", "primary"], result.stderr
        assert "rotation done" in result.stderr

        after = {r: view(g, r) for r in Role}
        new = file_ring(g)
        for r in Role:
            assert after[r]["epoch"] == before[r]["epoch"], f"{r.value}: the epoch moved"
            assert after[r]["active_role"] == "primary", f"{r.value}: activity moved"
            assert after[r]["keyring"] == {"key_ids": [1], "send_key_id": 1, "fingerprints": new.fingerprints()}
            assert after[r]["rejected_heartbeats"]["bad_mac"] == 0, after[r]["rejected_heartbeats"]
            assert after[r]["accepted_heartbeats"] > before[r]["accepted_heartbeats"]
        assert moves(g) == moved, "a rotation must not activate or step down anyone"
        assert 0 < during < 1500
        assert new.view() == {"key_ids": [1], "send_key_id": 1} and new.keys[1] != old.keys[0]
        assert (g.dir / "secret").stat().st_mode & 0o777 == 0o600
        for r in Role:
            state = g.config.node(r).data_dir / "keyring.json"
            assert state.stat().st_mode & 0o777 == 0o600 and Keyring.load(state) == new
        assert old.keys[0].hex() not in result.stdout + result.stderr, "the secret is never printed"
        for r in Role:  # each node logged its three steps, and never a secret
            logged = [e for e in g.events(r) if e["event"] == "secret_rotation_step"]
            assert [(e["step"], e["key_id"], e["send_key_id"]) for e in logged] == [
                ("add", 1, 0), ("use", 1, 1), ("retire", 0, 1)], logged
            assert not any(k.hex() in json.dumps(logged) for k in (old.keys[0], new.keys[1]))

        # Links keyed with the retired key were cut and redialled with the new one (the backup retires first).
        backup_log = (g.dir / "backup.log").read_text()
        for name in ("mate link", "config-sync"):
            assert f"backup: closing the {name} keyed with retired key id 0; it reconnects with key id 1" in backup_log
        g.wait_for("the backup to be in sync again", lambda: view(g, B)["in_sync"] and g.config_in_sync(), timeout_s=20)
        reply = change(g, P, {"kind": "limits.set", "name": "session_queue_max_messages", "value": 1234})
        assert reply["confirmed_by_standby"] is True, reply
        # And again after a restart of the backup (kill -9): its new handshakes use key id 1.
        g.kill(B)
        g.start(B)
        g.wait_for("the restarted backup to see both peers", lambda: sees_both(g, B), timeout_s=20)
        g.wait_for("the restarted backup to be in sync", lambda: view(g, B)["in_sync"], timeout_s=20)
        reply = change(g, P, {"kind": "limits.set", "name": "session_queue_max_messages", "value": 4321})
        assert reply["confirmed_by_standby"] is True, reply
        assert bad_macs(g) == {P: 0, B: 0, M: 0}

        # A backup that comes back with only the OLD secret (state wiped, old credential) is refused.
        g.kill(B)
        (g.config.node(B).data_dir / "keyring.json").unlink()
        creds = tmp_path / "creds"
        creds.mkdir()
        (creds / "pairmq-secret").write_text(old.keys[0].hex() + "\n")
        os.environ["CREDENTIALS_DIRECTORY"] = str(creds)
        g.other_tokens = [management_token(old.keys[0])]  # its API takes only the old secret's token
        try:
            g.start(B)
        finally:
            del os.environ["CREDENTIALS_DIRECTORY"]
        g.wait_for("the primary and monitor to reject the old-secret backup's heartbeats",
                   lambda: bad_macs(g)[P] > 0 and bad_macs(g)[M] > 0, timeout_s=20)
        g.wait_for("the old-secret backup to reject theirs", lambda: bad_macs(g)[B] > 0, timeout_s=20)
        assert view(g, B)["keyring"] == {"key_ids": [0], "send_key_id": 0, "fingerprints": old.fingerprints()}
        assert not any(p["seen"] for p in view(g, B)["peers"]), "nobody may accept the old secret"
        assert view(g, P)["active_role"] == "primary" and g.probe_once()[P] == 0
        # It never learns who is active, so it never dials: dial the active's mate link and config-sync
        # ports with the old key ourselves (the real handshake over a real socket). Both refuse at the HELLO.
        refused = api(g, P, "/api/v1/config-sync")[1]["refusals"].get("bad_proof", 0)
        assert dial_as_standby(g, g.config.ports.mate_link, old, "mate-link") == "closed"
        assert dial_as_standby(g, g.config.ports.config_sync, old, "config-sync") == "closed"
        assert api(g, P, "/api/v1/config-sync")[1]["refusals"]["bad_proof"] == refused + 1
        assert dial_as_standby(g, g.config.ports.config_sync, file_ring(g), "config-sync") == "challenged"
        # ...and one with the new secret (the rotated secret file) joins.
        g.kill(B)
        g.start(B)
        g.wait_for("the new-secret backup to see both peers", lambda: sees_both(g, B), timeout_s=20)
        g.wait_for("the new-secret backup to be in sync", lambda: view(g, B)["in_sync"], timeout_s=20)
        assert view(g, B)["keyring"] == {"key_ids": [1], "send_key_id": 1, "fingerprints": new.fingerprints()}
        assert moves(g)[P] == moved[P], "the primary stayed active throughout"


def test_restart_of_each_role_mid_rotation_resumes_where_it_persisted(tmp_path):
    with active_group(tmp_path / "group") as g:
        def rotate_to(args: tuple[str, ...], send: int) -> str:
            """Run `secret rotate ARGS`; every node and the secret file then hold keys 0 and 1, sending with `send`."""
            result = cli(g, "rotate", *args)
            assert result.returncode == 0, result.stderr
            assert keys(g) == {r: ([0, 1], send) for r in Role}
            assert file_ring(g).view() == {"key_ids": [0, 1], "send_key_id": send}
            return result.stderr

        def restart(role: Role) -> None:
            g.kill(role)
            g.start(role)
            g.wait_for(f"the restarted {role.value} to see both peers", lambda: sees_both(g, role), timeout_s=20)

        assert "stopped after step 1/3" in rotate_to(("--stop-after", "add"), 0)
        # The monitor restarts between step 1 and 2: it comes back holding both keys, sending with 0.
        restart(M)
        assert keys(g)[M] == ([0, 1], 0)
        assert "step 1/3 (add key id 1): monitor: already done" in rotate_to(("--resume", "--stop-after", "use"), 1)
        # The standby restarts between step 2 and 3 (kill -9): both keys, sending with 1.
        restart(B)
        g.wait_for("the restarted backup to be in sync", lambda: view(g, B)["in_sync"], timeout_s=20)
        assert keys(g)[B] == ([0, 1], 1)
        epoch = view(g, P)["epoch"]
        moved = moves(g)

        # The active stops (SIGTERM hands over to the backup) and comes back as the standby.
        g.signal(P, 15)
        g.procs.pop(P).wait(20)
        g.wait_for("the backup to serve", lambda: g.probe_once()[B] == 0, timeout_s=20)
        g.start(P)
        g.wait_for("the restarted primary to see both peers", lambda: sees_both(g, P), timeout_s=20)
        assert keys(g)[P] == ([0, 1], 1)
        assert moves(g)[M] == moved[M]
        epoch_after_handover = view(g, B)["epoch"]
        assert epoch_after_handover > epoch

        result = cli(g, "rotate", "--resume")
        assert result.returncode == 0, result.stderr
        retire = [line for line in result.stderr.splitlines() if line.startswith("step 3/3")]
        assert [line.split(": ")[1] for line in retire] == ["monitor", "primary", "backup"], "active (backup) last"
        assert keys(g) == {r: ([1], 1) for r in Role}
        assert view(g, B)["epoch"] == epoch_after_handover and view(g, B)["active_role"] == "backup"
        assert bad_macs(g) == {P: 0, B: 0, M: 0}

        result = cli(g, "rotate", "--resume")
        assert result.returncode == 1 and "no rotation to resume" in result.stderr


def test_bad_inputs_are_refused_with_one_sentence_and_change_nothing(tmp_path):
    with active_group(tmp_path / "group") as g:
        ring = file_ring(g)
        token = management_token(ring.send_secret)
        steps = "/api/v1/secret/steps"

        def unchanged(roles=tuple(Role)) -> None:
            assert {r: keys_of(g, r) for r in roles} == {r: ([0], 0) for r in roles}
            assert file_ring(g) == ring
            assert not (g.config.node(P).data_dir / "keyring.json").exists()

        from pairmq.appliance.keyring import wrap
        good = wrap(os.urandom(32), key_id=1, wrapping=ring, group="test", role="primary", nonce=os.urandom(12))
        tampered = dict(good, ciphertext=good["ciphertext"][:-2] + ("00" if good["ciphertext"][-2:] != "00" else "11"))
        cases = [
            ({"step": "add", "key_id": 1, "wrapped": tampered}, token, 400, "does not authenticate"),
            ({"step": "add", "key_id": 2, "wrapped": good}, token, 400, "does not authenticate"),  # wrapped for id 1
            ({"step": "add", "key_id": 1, "wrapped": dict(good, wrap_key_id=7)}, token, 400, "key id 7"),
            ({"step": "add", "key_id": 1}, token, 400, "never travels in clear"),
            ({"step": "use", "key_id": 9}, token, 409, "does not hold key id 9"),
            ({"step": "retire", "key_id": 0}, token, 409, "still sends with key id 0"),
            ({"step": "spin", "key_id": 1}, token, 400, "step must be one of"),
            ({"step": "use", "key_id": 256}, token, 400, "key_id must be a whole number"),
            ({"step": "use", "key_id": 0}, "0" * 64, 401, "does not verify"),
        ]
        for body, tok, status, words in cases:
            got, reply = api(g, P, steps, body, tok)
            assert got == status and words in reply["error"], (body, got, reply)
            assert reply["error"].count(". ") == 0, "one sentence"
        # The same wrapped secret sent to another node does not open (it is bound to the primary).
        got, reply = api(g, B, steps, {"step": "add", "key_id": 1, "wrapped": good}, token)
        assert got == 400 and "does not authenticate" in reply["error"], reply
        unchanged()

        # Another host's rotation gave the backup another key id 1: this host's two-key file does not match it.
        theirs = wrap(os.urandom(32), key_id=1, wrapping=ring, group="test", role="backup", nonce=os.urandom(12))
        assert api(g, B, steps, {"step": "add", "key_id": 1, "wrapped": theirs}, token)[0] == 200
        result = cli(g, "rotate")
        assert result.returncode == 1 and "the backup holds key ids 0, 1" in result.stderr, result.stderr
        ours = Keyring({0: ring.keys[0], 1: os.urandom(32)}, 0)
        (g.dir / "secret").write_text(ours.to_text())
        result = cli(g, "rotate", "--resume")
        assert result.returncode == 1 and "the backup holds key id 1 with another secret" in result.stderr
        assert "nothing was changed" in result.stderr and file_ring(g) == ours
        assert keys_of(g, P) == ([0], 0) and keys_of(g, M) == ([0], 0)
        assert api(g, B, steps, {"step": "retire", "key_id": 1}, token)[0] == 200  # undo the other host's step
        (g.dir / "secret").write_text(ring.to_text())
        unchanged()

        # Rotation while a node is unreachable: refused up front, nothing written anywhere.
        g.kill(M)
        result = cli(g, "rotate")
        assert result.returncode == 1
        assert result.stderr == (f"error: cannot reach the monitor node at http://{g.address(M)}:8080: connection refused "
                                 "(is the node running?); a rotation needs all three nodes answering; nothing was "
                                 "changed\n"), result.stderr
        assert "nothing was changed" in result.stderr
        unchanged((P, B))
        fp = ring.fingerprints()["0"]
        shown = show_secret(g)
        assert shown.returncode == 0 and shown.stdout == (
            "           group test: secret key ids           \n"
            "┏━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━┓\n"
            "┃ node    ┃ key ids (fingerprint) ┃ sends with ┃\n"
            "┡━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━┩\n"
            f"│ primary │ 0 ({fp})      │ 0          │\n"
            f"│ backup  │ 0 ({fp})      │ 0          │\n"
            "│ monitor │ unreachable           │ -          │\n"
            "└─────────┴───────────────────────┴────────────┘\n"), shown.stdout
        assert shown.stderr == f"{g.dir / 'secret'}: key ids 0 ({fp})\n"
        result = cli(g, "rotate", "--resume")
        assert result.returncode == 1 and "nothing was changed" in result.stderr
        unchanged((P, B))

        # A node down mid-rotation: the rotation stops at the step that needs it and says how to finish;
        # the node comes back with the keys it persisted and --resume completes.
        g.start(M)
        g.wait_for("the monitor to see both peers", lambda: sees_both(g, M), timeout_s=20)
        stopped = cli(g, "rotate", "--stop-after", "add", "--json")
        assert stopped.returncode == 0, stopped.stderr
        document = json.loads(stopped.stdout)  # --json: one document, the steps done and where it stopped
        assert document["ok"] and document["stopped_after"] == "add" and document["done"] is False
        assert (document["old_key_id"], document["new_key_id"]) == (0, 1)
        assert sorted(s["node"] for s in document["steps"] if s["step"] == "add") == ["backup", "monitor", "primary"]
        g.kill(B)
        result = cli(g, "rotate", "--resume")
        assert result.returncode == 1 and "backup" in result.stderr and "--resume" in result.stderr, result.stderr
        assert keys_of(g, P) == ([0, 1], 0) and keys_of(g, M) == ([0, 1], 0), "no step may start without the backup"
        g.start(B)
        g.wait_for("the backup to see both peers", lambda: sees_both(g, B), timeout_s=20)
        result = cli(g, "rotate")  # a fresh rotation while one is under way is refused
        assert result.returncode == 1 and "--resume" in result.stderr
        result = cli(g, "rotate", "--resume", "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["done"] is True
        assert keys(g) == {r: ([1], 1) for r in Role}
        assert bad_macs(g) == {P: 0, B: 0, M: 0}
        shown = json.loads(show_secret(g, "--json").stdout)
        assert [(n["role"], n["key_ids"], n["send_key_id"]) for n in shown["nodes"]] == [
            ("primary", [1], 1), ("backup", [1], 1), ("monitor", [1], 1)]


def test_secret_file_format_errors_are_one_sentence(tmp_path):
    from pairmq.appliance.errors import ConfigError

    for text, words in [("", "is empty"), ("zz\n", "hex digits"), ("300:" + "ab" * 32, "key id '300'"),
                        ("1:" + "ab" * 32 + "\n1:" + "cd" * 32, "key id 1 twice"), ("abcd", "too short"),
                        ("\n".join(f"{i}:" + "ab" * 32 for i in range(3)), "has 3 keys")]:
        with pytest.raises(ConfigError, match=words):
            Keyring.from_text(text, "f")
    assert Keyring.from_text("ab" * 32 + "\n", "f").view() == {"key_ids": [0], "send_key_id": 0}
    two = Keyring.from_text("4:" + "cd" * 32 + "\n3:" + "ab" * 32, "f")
    assert two.view() == {"key_ids": [3, 4], "send_key_id": 4}
    assert Keyring.from_text(two.to_text(), "f") == two
    bad = tmp_path / "keyring.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="delete it to start from the secret file"):
        Keyring.load(bad)


def test_startup_keyring_persisted_wins_unless_the_secret_file_is_newer(tmp_path):
    from pairmq.appliance.keyring import startup_keyring

    a, b, c = (bytes([n]) * 32 for n in (1, 2, 3))
    state = tmp_path / "keyring.json"
    file_old = Keyring({0: a}, 0)
    assert startup_keyring(file_old, state) == file_old  # nothing persisted: the file
    mid = Keyring({0: a, 1: b}, 1)
    mid.save(state)
    assert startup_keyring(file_old, state) == mid  # a restart mid-rotation keeps its step
    assert startup_keyring(Keyring({1: b, 0: a}, 0), state) == mid  # same newest key: still the persisted step
    replaced = Keyring({1: c}, 1)
    assert startup_keyring(replaced, state) == replaced  # same id, another secret: replaced by hand
    newer = Keyring({2: c}, 2)
    assert startup_keyring(newer, state) == newer  # a higher key id: the operator installed a newer secret


def test_a_wrapped_secret_opens_only_for_its_node_group_and_key_ids():
    from pairmq.appliance.keyring import BadWrap, unwrap, wrap

    ring = Keyring({3: b"k" * 32}, 3)
    new = os.urandom(32)
    wrapped = wrap(new, key_id=4, wrapping=ring, group="g", role="backup", nonce=os.urandom(12))
    assert new.hex() not in json.dumps(wrapped)
    assert unwrap(wrapped, key_id=4, keyring=ring, group="g", role="backup") == new
    for kw in ({"key_id": 5}, {"group": "h"}, {"role": "primary"}):
        args = {"key_id": 4, "keyring": ring, "group": "g", "role": "backup", **kw}
        with pytest.raises(BadWrap, match="does not authenticate"):
            unwrap(wrapped, **args)
    with pytest.raises(BadWrap, match="key id 3, which this node does not hold"):
        unwrap(wrapped, key_id=4, keyring=Keyring({0: b"k" * 32}, 0), group="g", role="backup")
    with pytest.raises(BadWrap, match="wrapped must be"):
        unwrap({"wrap_key_id": 3, "nonce": "zz"}, key_id=4, keyring=ring, group="g", role="backup")


def test_handshake_names_its_key_id_and_the_active_accepts_any_key_it_holds():
    from pairmq.mate_link.secure import ActiveHandshake, HandshakeFailed, Stage, StandbyHandshake

    old, new = b"o" * 32, b"n" * 32

    def run(standby_ring: Keyring, active_ring: Keyring):
        standby = StandbyHandshake(standby_ring, "g", B, os.urandom(32))
        active = ActiveHandshake(active_ring, "g", P, os.urandom(32))
        active.receive_data(standby.data_to_send())
        standby.receive_data(active.data_to_send())
        active.receive_data(standby.data_to_send())
        return standby, active

    both = Keyring({0: old, 1: new}, 0)
    for standby_ring in (Keyring({0: old}, 0), Keyring({1: new}, 1), both, Keyring({0: old, 1: new}, 1)):
        standby, active = run(standby_ring, both)
        assert standby.stage is active.stage is Stage.ESTABLISHED and active.key_id == standby_ring.send_id
        assert active.channel is not None and standby.channel is not None
        frame = standby.channel.seal(b"hello")
        active.channel.receive_data(frame)
        assert active.channel.next_frame() == b"hello"
    with pytest.raises(HandshakeFailed, match="key id 0, which this node does not hold") as refused:
        run(Keyring({0: old}, 0), Keyring({1: new}, 1))
    assert refused.value.reason == "bad_proof"
    with pytest.raises(HandshakeFailed, match="does not verify"):  # same key id, another secret
        run(Keyring({1: old}, 1), Keyring({1: new}, 1))


def test_a_refusal_mid_step_stops_there_and_the_group_keeps_working(tmp_path):
    from pairmq.appliance.keyring import wrap

    with active_group(tmp_path / "group") as g:
        ring = file_ring(g)
        token = management_token(ring.send_secret)
        # The backup holds a stray key id 2 (say, a half-done rotation from another host): it cannot take a third.
        stray = wrap(os.urandom(32), key_id=2, wrapping=ring, group="test", role="backup", nonce=os.urandom(12))
        assert api(g, B, "/api/v1/secret/steps", {"step": "add", "key_id": 2, "wrapped": stray}, token)[0] == 200
        two = Keyring({0: ring.keys[0], 1: os.urandom(32)}, 0)
        (g.dir / "secret").write_text(two.to_text())
        epoch, moved = view(g, P)["epoch"], moves(g)
        result = cli(g, "rotate", "--resume")
        assert result.returncode == 1
        assert result.stderr.splitlines()[-1] == (
            "error: step 1/3 (add) failed on the backup: this node already holds key ids 0, 2; finish the rotation "
            "under way with `pairmq secret rotate --resume` first; the group keeps working on the keys it holds; "
            "run `pairmq secret rotate --resume`"), result.stderr
        assert "step 1/3 (add key id 1): monitor: done" in result.stderr
        assert keys(g) == {M: ([0, 1], 0), B: ([0, 2], 0), P: ([0], 0)}, "stopped at the backup, the active untouched"
        assert view(g, P)["epoch"] == epoch and moves(g) == moved and g.probe_once()[P] == 0
        assert bad_macs(g) == {P: 0, B: 0, M: 0}
        # The operator clears the stray key and resumes: the monitor's step is skipped, the rest done.
        assert api(g, B, "/api/v1/secret/steps", {"step": "retire", "key_id": 2}, token)[0] == 200
        result = cli(g, "rotate", "--resume")
        assert result.returncode == 0, result.stderr
        assert "step 1/3 (add key id 1): monitor: already done" in result.stderr
        assert keys(g) == {r: ([1], 1) for r in Role} and file_ring(g).keys == {1: two.keys[1]}
        assert view(g, P)["epoch"] == epoch and moves(g) == moved
        assert bad_macs(g) == {P: 0, B: 0, M: 0}
