"""A three-node NATS JetStream cluster serving MQTT, the replicated peer bench/replication.py compares with.

Debian's nats-server (2.9.10 on Debian 12; .ci/setup installs it). Three processes on 127.0.0.1,
each with its own free client, cluster, monitoring (http) and MQTT ports, routes to the other two,
JetStream on (store_dir in the bench's work directory) and `mqtt { stream_replicas: 3 }`, so the
streams JetStream's MQTT support creates ($MQTT_msgs, $MQTT_sess, ...) are replicated on all three:
a QoS 1 PUBLISH is acknowledged once a quorum (2 of 3) of the stream's replicas stored it.
`stream_replicas` is checked after the load by reading each stream's configuration from the
monitoring endpoint (/jsz), so a report never calls an R1 stream R3.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from bench.brokers import Target, free_port, log, stop_process, wait_listening

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"
NODES = 3
REPLICAS = 3
READY_TIMEOUT_S = 60.0


def version() -> str:
    out = subprocess.run([NATS_SERVER, "--version"], capture_output=True, text=True)
    return (out.stdout or out.stderr).strip().removeprefix("nats-server: ")


def _config(i: int, ports: list[dict], store: Path) -> str:
    me = ports[i]
    routes = ", ".join(f"nats-route://127.0.0.1:{p['cluster']}" for j, p in enumerate(ports) if j != i)
    return "\n".join([
        f"server_name: n{i + 1}",
        f"listen: 127.0.0.1:{me['client']}",
        f"http: 127.0.0.1:{me['http']}",
        f'jetstream {{ store_dir: "{store}" }}',
        f"cluster {{ name: bench, listen: 127.0.0.1:{me['cluster']}, routes: [{routes}] }}",
        f"mqtt {{ listen: 127.0.0.1:{me['mqtt']}, stream_replicas: {REPLICAS} }}",
        "max_payload: 1MB", ""])


def jsz(http_port: int) -> dict:
    url = f"http://127.0.0.1:{http_port}/jsz?accounts=true&streams=true&config=true"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def stream_replicas(http_port: int) -> dict[str, int]:
    """{stream name: configured replicas} of every stream the server knows (the MQTT ones after a run)."""
    out = {}
    for account in jsz(http_port).get("account_details", []):
        for stream in account.get("stream_detail", []):
            out[stream["name"]] = stream.get("config", {}).get("num_replicas", 0)
    return out


def _cluster_ready(http_ports: list[int]) -> bool:
    """The JetStream meta leader (only it lists the replicas) sees the other two, current."""
    for port in http_ports:
        try:
            meta = jsz(port).get("meta_cluster", {})
        except OSError:
            continue
        replicas = meta.get("replicas", [])
        if len(replicas) == NODES - 1 and all(r.get("current") for r in replicas):
            return True
    return False


@contextlib.contextmanager
def run_nats_cluster(workdir: Path):
    """Three nats-servers; yields the Target of node 1's MQTT listener (the load goes there, like a client
    that connected to one of them). Every process is stopped on the way out."""
    directory = workdir / "nats"
    directory.mkdir()
    ports = [{k: free_port() for k in ("client", "cluster", "http", "mqtt")} for _ in range(NODES)]
    procs: list[subprocess.Popen] = []
    try:
        for i in range(NODES):
            conf = directory / f"n{i + 1}.conf"
            conf.write_text(_config(i, ports, directory / f"js{i + 1}"))
            procs.append(subprocess.Popen([NATS_SERVER, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                          stderr=open(directory / f"n{i + 1}.log", "wb"), start_new_session=True))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _cluster_ready([p["http"] for p in ports]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the NATS cluster elected no JetStream meta leader in {READY_TIMEOUT_S} s "
                                   f"(logs in {directory})")
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"nats-server exited with code {p.returncode} (logs in {directory})")
            time.sleep(0.2)
        for p, i in zip(procs, range(NODES)):
            wait_listening("127.0.0.1", ports[i]["mqtt"], p, timeout_s=READY_TIMEOUT_S)
        log(f"  nats: {NODES} servers, JetStream meta leader elected, MQTT on 127.0.0.1:{ports[0]['mqtt']}")
        target = Target("nats-r3", "127.0.0.1", ports[0]["mqtt"], procs[0].pid)
        target.notes = lambda: _replica_notes(ports[0]["http"])
        target.check = lambda: _require_r3(ports[0]["http"])
        yield target
    finally:
        for p in procs:
            stop_process(p)


def _require_r3(http_port: int) -> dict[str, int]:
    streams = stream_replicas(http_port)
    mqtt = {name: n for name, n in streams.items() if name.startswith("$MQTT")}
    if not mqtt:
        raise RuntimeError(f"no $MQTT streams on the NATS cluster after the load (streams: {streams})")
    short = {name: n for name, n in mqtt.items() if n != REPLICAS}
    if short:
        raise RuntimeError(f"NATS MQTT streams not R{REPLICAS}: {short}")
    return mqtt


def _replica_notes(http_port: int) -> list[str]:
    try:
        mqtt = _require_r3(http_port)
    except (RuntimeError, OSError) as exc:
        return [f"NATS stream replicas NOT verified: {exc}"]
    return ["NATS MQTT streams (from /jsz): " + ", ".join(f"{name} R{n}" for name, n in sorted(mqtt.items()))]
