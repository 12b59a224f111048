"""`pairmq spool verify|migrate` and `pairmq show message-spool` on real node processes (docs/spool.md): the real
console script reads a node's spool while the node serves from it and after it stopped, and agrees with the
node's own view; an old-layout spool stops a node at start with one sentence, and once migrated offline the
node starts on it and delivers the messages it held to a real paho-mqtt client."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys

import paho.mqtt.client as mqtt

from pairmq.appliance.roles import Role
from tests.harness import paho_clients
from tests.harness.group import REPO, Group, active_group
from tests.harness.legacy_spool import offline_session, write_old_spool

P, B = Role.PRIMARY, Role.BACKUP
MESSAGES = 40


def pairmq(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PAIRMQ_GROUP"}
    return subprocess.run([sys.executable, "-m", "pairmq.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def verify_json(directory) -> tuple[int, dict, str]:
    done = pairmq("spool", "verify", directory, "--json")
    return done.returncode, json.loads(done.stdout), done.stderr


def disk(g: Group, role: Role) -> dict:
    return g.api(role, "/api/v1/message-spool")["disk"]


def test_verify_reads_a_serving_nodes_spool_and_agrees_with_show_message_spool(tmp_path):
    with active_group(tmp_path / "group") as g:
        host = g.address(P)
        paho_clients.subscribe_then_go_offline(host)
        pub, _ = paho_clients.client("door-sensor", host, persistent=False)
        for i in range(MESSAGES):
            pub.publish("cars/7/door", str(i).encode(), qos=1).wait_for_publish(10)  # PUBACK: on both nodes
        pub.disconnect()
        pub.loop_stop()
        g.wait_for("both spools to hold the same head", lambda: disk(g, P)["log_head"] == disk(g, B)["log_head"]
                   and g.api(P, "/api/v1/message-spool")["writer"]["pending_ops"] == 0)

        for _ in range(5):  # a check during which the node wrote nothing compares exactly (it rarely does here)
            before = g.api(P, "/api/v1/message-spool")
            code, report, err = verify_json(g.config.node(P).data_dir / "spool")
            after = g.api(P, "/api/v1/message-spool")
            if before["disk"] == after["disk"]:
                break
        assert before["disk"] == after["disk"], "the node wrote during every check"
        assert code == 0, err
        assert report["sound"] and report["in_use"] and report["damage"] is None
        assert "a process holds" in err
        assert report["head"]["seq"] == after["disk"]["log_head"]["seq"]
        assert report["base"]["seq"] == after["disk"]["log_base"]["seq"]
        assert len(report["segments"]) == after["disk"]["segments"]
        assert sum(s["bytes"] for s in report["segments"]) == after["disk"]["segment_bytes"]
        assert report["totals"]["queued_messages"] == after["queued_messages"] == MESSAGES
        assert report["totals"]["sessions"] == after["sessions"]
        assert report["totals"]["stored_bytes"] == after["writer"]["stored_bytes"]  # the bodies as the spool holds them
        checkpoint = after["disk"]["checkpoint"]["seq"]
        assert [c["point"]["seq"] for c in report["checkpoints"] if c["verified"]] == ([checkpoint] if checkpoint
                                                                                      else [])
        code, standby, err = verify_json(g.config.node(B).data_dir / "spool")
        assert code == 0, err
        assert standby["sound"] and standby["totals"]["queued_messages"] == MESSAGES
        assert standby["head"] == report["head"]  # the same records: the same chain, checksum and all

        table = pairmq("show", "message-spool", "--group", g.dir / "group.toml")
        assert table.returncode == 0, table.stderr
        rows = {line.split("  ")[0]: line for line in table.stdout.splitlines()}
        assert {"Log", "Checkpoint", "Segments", "On disk"} <= set(rows), table.stdout
        spool_dir = g.config.node(P).data_dir / "spool"
    code, stopped, err = verify_json(spool_dir)  # the group stopped (SIGTERM): a checkpoint at the head
    assert code == 0, err
    assert stopped["sound"] and not stopped["in_use"]
    assert stopped["checkpoints"][-1]["point"] == stopped["head"]
    assert stopped["totals"]["queued_messages"] == MESSAGES


def test_an_old_spool_refuses_to_start_then_migrated_it_serves_what_it_held(tmp_path):
    payloads = [f"kept {i}".encode() for i in range(5)]
    with Group(tmp_path / "group") as g:
        spool_dir = g.config.node(P).data_dir / "spool"
        head = write_old_spool(spool_dir, offline_session("keeper", "plant/#", payloads))
        old = (spool_dir / "spool.db").read_bytes()
        refused = pairmq("node", "--role", "primary", "--group", g.dir / "group.toml")
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        last = [line for line in refused.stderr.splitlines() if line.strip()][-1]
        assert f"spool {spool_dir} holds the old SQLite layout (spool.db)" in last, refused.stderr
        assert f"`pairmq spool migrate {spool_dir}`" in last
        assert (spool_dir / "spool.db").read_bytes() == old

        migrated = pairmq("spool", "migrate", spool_dir)
        assert migrated.returncode == 0, migrated.stderr
        assert migrated.stdout.startswith(f"migrated {spool_dir}: head op {head.seq} (epoch 1), 1 session, "
                                          "5 stored messages; ")
        assert (spool_dir.parent / "spool.old-layout" / "spool.db").read_bytes() == old
        code, report, err = verify_json(spool_dir)
        assert code == 0 and report["head"]["seq"] == head.seq and report["totals"]["queued_messages"] == 5, err

        g.start()
        g.wait_for("the primary to take activity", lambda: g.probe_once(in_process=True)[P] == 0, timeout_s=20)
        again = pairmq("spool", "migrate", spool_dir)  # the node holds it now; there is nothing to migrate anyway
        assert again.returncode == 1 and again.stderr.startswith("error: nothing to migrate: "), again.stderr
        got: queue.Queue = queue.Queue()
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="keeper", protocol=mqtt.MQTTv311,
                        clean_session=False)
        c.on_message = lambda cl, ud, msg: got.put((msg.topic, msg.payload, msg.qos))
        c.connect(g.address(P), 1883, keepalive=30)
        c.loop_start()
        try:
            received = [got.get(timeout=10) for _ in payloads]
        finally:
            c.disconnect()
            c.loop_stop()
        assert received == [("plant/kept", p, 1) for p in payloads]
