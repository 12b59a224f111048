"""Hostile-input benchmark: what decoding costs per byte as packets grow, and whether a live group keeps
serving a legitimate client while unauthenticated clients flood it.

    .venv/bin/python bench/hostile.py                   both parts; a table on stdout
    .venv/bin/python bench/hostile.py --part codec      the decoding cost only (no processes)
    ... --write-docs                                    also replace the hostile block in docs/benchmarks.md

Codec: CONNECT with n empty User Properties, PUBLISH with n User Properties, SUBSCRIBE with n filters,
each read by the broker's own PacketReader; CPU per byte (time.process_time over repetitions) at each
size, the fitted exponent of CPU against bytes (1 = linear, 2 = quadratic) and the ratio of µs/byte at
the largest size to the smallest (flat means linear). A size whose single decode costs more than
`--codec-cap-s` of CPU is the last one measured.

Flood: a loopback group (tests/harness/group.py) with two users and anonymous access refused. A legitimate
client logged in before the flood sends a PINGREQ every 50 ms; its round trips (p50/p99; a PINGRESP
that does not come within 2 s counts as 2 s and as late) are measured during each phase, run by a
separate attacker process so the measuring loop shares no CPU with it: half-sent CONNECTs
(connections that send a CONNECT's header and part of its body, then nothing); a wrong-password
flood (plus a first, uncached, correct login of another user timed in the middle of it); slowloris
and idle connections on 8080; last, a few whole CONNECTs of 60,000 empty User Properties each. Also:
the primary's peak RSS (sampled VmRSS; VmHWM at the end) and whether activity moved (the nodes' own
redundancy decisions). The same half-sent-CONNECT flood goes to mosquitto as a peer.
Every phase has a duration and every wait a deadline: the bench stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pairmq.appliance.mqtt.codec import PacketReader  # noqa: E402
from tests.harness.mqttraw import utf8, vbi  # noqa: E402

DOC_BEGIN, DOC_END = "<!-- hostile:begin -->", "<!-- hostile:end -->"
USER, PASSWORD = "alice", b"alice-legit-pw"
FRESH_USER = "bob"  # logs in for the first time during the password flood: no cached credential
PING_EVERY_S = 0.05
PING_LATE_S = 2.0
GOAL_P99_MS = 100.0
GOAL_RSS_MIB = 256  # the primary's peak RSS under the floods below (a fresh primary uses ~60-120 MiB)


def attacker_source(host: str) -> str:
    """The address the floods come from: another loopback address than the legitimate clients', as an attacker's
    own host would be (the per-address budgets are what they meet first)."""
    base, last = host.rsplit(".", 1)
    return f"{base}.{int(last) + 7}"


def _attacker_connection(host: str, port: int):
    return asyncio.open_connection(host, port, local_addr=(attacker_source(host), 0))


# --- codec: CPU per byte -----------------------------------------------------------------------------------

def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + vbi(len(body)) + body


def _props(block: bytes) -> bytes:
    return vbi(len(block)) + block


def connect_with_user_properties(n: int) -> bytes:
    return _packet(0x10, utf8("MQTT") + b"\x05\x02\x00\x3c" + _props(b"\x26\x00\x00\x00\x00" * n) + utf8("c"))


def publish_with_user_properties(n: int) -> bytes:
    return _packet(0x30, utf8("a/b") + _props((b"\x26" + utf8("key") + utf8("value")) * n) + b"payload")


def subscribe_with_filters(n: int) -> bytes:
    return _packet(0x82, b"\x00\x01\x00" + b"".join(utf8(f"s/{i % 100000:05d}") + b"\x01" for i in range(n)))


CONNECT_V5 = _packet(0x10, utf8("MQTT") + b"\x05\x02\x00\x3c\x00" + utf8("c"))
CODEC_CASES = {
    "CONNECT, n empty User Properties": (connect_with_user_properties, b""),
    "PUBLISH, n User Properties": (publish_with_user_properties, CONNECT_V5),
    "SUBSCRIBE, n filters": (subscribe_with_filters, CONNECT_V5),
}
CODEC_SIZES = (250, 1000, 4000, 16000, 64000)


def _decode_cpu_s(prefix: bytes, packet: bytes, reps: int) -> float:
    start = time.process_time()
    for _ in range(reps):
        reader = PacketReader()
        reader.feed(prefix + packet)
        try:
            while reader.next_packet() is not None:
                pass
        except Exception:  # a cap refusing the packet is a result too: it cost what it cost
            pass
    return (time.process_time() - start) / reps


def codec_part(cap_s: float) -> list[dict]:
    rows = []
    for name, (build, prefix) in CODEC_CASES.items():
        points = []
        for n in CODEC_SIZES:
            packet = build(n)
            once = _decode_cpu_s(prefix, packet, 1)
            reps = max(1, min(200, int(0.3 / max(once, 1e-6))))
            cpu = min(once, _decode_cpu_s(prefix, packet, reps)) if reps > 1 else once
            points.append({"n": n, "bytes": len(packet), "cpu_s": cpu, "us_per_byte": cpu * 1e6 / len(packet)})
            print(f"codec: {name}, n={n}: {len(packet):,} bytes, {cpu * 1e3:.2f} ms", file=sys.stderr, flush=True)
            if once > cap_s:
                break
        xs = [math.log(p["bytes"]) for p in points]
        ys = [math.log(max(p["cpu_s"], 1e-9)) for p in points]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        rows.append({"case": name, "points": points, "exponent": slope,
                     "ratio": points[-1]["us_per_byte"] / points[0]["us_per_byte"]})
    return rows


# --- the attacker process ------------------------------------------------------------------------------------

async def _half_connect(host: str, port: int, n: int, body_bytes: int, seconds: float) -> dict:
    """n connections, each a CONNECT claiming just under the 1 MiB packet limit, of which it sends
    `body_bytes`, then silence."""
    head = b"\x10" + vbi((1 << 20) - 8) + utf8("MQTT") + b"\x05\x02\x00\x3c"
    writers, refused = [], 0
    deadline = time.monotonic() + seconds
    for _ in range(n):
        if time.monotonic() > deadline:
            break
        try:
            reader, writer = await asyncio.wait_for(_attacker_connection(host, port), 5)
            writer.write(head + bytes(body_bytes))
            writers.append((reader, writer))
        except (OSError, asyncio.TimeoutError):
            refused += 1
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    closed = sum(1 for r, _ in writers if r.at_eof() or r.exception() is not None)
    for _, w in writers:
        w.transport.abort()
    return {"opened": len(writers), "refused": refused, "closed_by_server": closed}


async def _wrong_passwords(host: str, port: int, n: int, seconds: float) -> dict:
    """n workers, each: CONNECT as the real user with a new wrong password (a guesser's: no cache can
    answer it), read the CONNACK, again."""
    deadline = time.monotonic() + seconds
    counts: dict[str, int] = {}
    guesses = iter(range(1 << 62))

    async def worker() -> None:
        while time.monotonic() < deadline:
            packet = _packet(0x10, utf8("MQTT") + b"\x04\xc2\x00\x3c" + utf8("x") + utf8(USER)
                             + utf8(f"guess-{next(guesses)}"))
            try:
                reader, writer = await asyncio.wait_for(_attacker_connection(host, port), 5)
                writer.write(packet)
                answer = await asyncio.wait_for(reader.read(4), max(0.1, deadline - time.monotonic()))
                key = f"connack {answer[3]}" if len(answer) == 4 else "closed"
                writer.transport.abort()
            except (OSError, asyncio.TimeoutError):
                key = "no answer"
            counts[key] = counts.get(key, 0) + 1

    await asyncio.gather(*(worker() for _ in range(n)))
    return counts


async def _big_connects(host: str, port: int, n: int, props: int, seconds: float) -> dict:
    """n connections at once, each one whole CONNECT with `props` empty User Properties, no credentials."""
    packet = connect_with_user_properties(props)
    deadline = time.monotonic() + seconds

    async def one() -> str:
        try:
            reader, writer = await asyncio.wait_for(_attacker_connection(host, port), 5)
            writer.write(packet)
            answer = await asyncio.wait_for(reader.read(4), max(0.1, deadline - time.monotonic()))
            writer.transport.abort()
            return f"connack 0x{answer[3]:02x}" if len(answer) == 4 else "closed"
        except (OSError, asyncio.TimeoutError):
            return "no answer"

    counts: dict[str, int] = {}
    for key in await asyncio.gather(*(one() for _ in range(n))):
        counts[key] = counts.get(key, 0) + 1
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    return counts


async def _slowloris(host: str, port: int, n: int, idle: int, seconds: float) -> dict:
    """n connections trickling one header line every 2 s, never ending the request; `idle` silent ones."""
    conns, refused = [], 0
    for i in range(n + idle):
        try:
            reader, writer = await asyncio.wait_for(_attacker_connection(host, port), 5)
            if i < n:
                writer.write(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n")
            conns.append((i < n, reader, writer))
        except (OSError, asyncio.TimeoutError):
            refused += 1
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        for slow, _, writer in conns:
            if slow and not writer.is_closing():
                writer.write(b"X-a: b\r\n")
    still = sum(1 for _, r, _ in conns if not r.at_eof() and r.exception() is None)
    for _, _, w in conns:
        w.transport.abort()
    return {"opened": len(conns), "refused": refused, "still_open_at_end": still}


def attack_main(argv: list[str]) -> None:
    kind, host, port, seconds, n, extra = argv[0], argv[1], int(argv[2]), float(argv[3]), int(argv[4]), int(argv[5])
    if kind == "half_connect":
        result = asyncio.run(_half_connect(host, port, n, extra, seconds))
    elif kind == "wrong_password":
        result = asyncio.run(_wrong_passwords(host, port, n, seconds))
    elif kind == "big_connect":
        result = asyncio.run(_big_connects(host, port, n, extra, seconds))
    else:
        result = asyncio.run(_slowloris(host, port, n, extra, seconds))
    print(json.dumps(result))


# --- the legitimate client and the phases --------------------------------------------------------------------

async def _login(host: str, port: int, client_id: str, user: str | None) -> tuple[asyncio.StreamReader,
                                                                                   asyncio.StreamWriter, int]:
    flags, tail = 0x02, b""
    if user is not None:
        flags |= 0xC0
        tail = utf8(user) + utf8(PASSWORD.decode())
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    writer.write(_packet(0x10, utf8("MQTT") + bytes([4, flags]) + b"\x00\x3c" + utf8(client_id) + tail))
    answer = await asyncio.wait_for(reader.readexactly(4), 30)
    return reader, writer, answer[3]


async def _pinger(host: str, port: int, user: str | None, stop: asyncio.Event) -> dict:
    rtts, late, dropped, refused = [], 0, 0, 0
    reader, writer, code = await _login(host, port, "legit-pinger", user)
    assert code == 0, f"the legitimate client was refused ({code})"  # before any flood: the set-up is wrong
    connected = True
    while not stop.is_set():
        if not connected:  # e.g. the node gave up activity: log in again, twice a second at most
            writer.transport.abort()
            try:
                reader, writer, code = await _login(host, port, "legit-pinger", user)
                connected = code == 0
                refused += not connected
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                refused += 1
            if not connected:
                await asyncio.sleep(0.5)
            continue
        sent = time.perf_counter()
        try:
            writer.write(b"\xc0\x00")
            answer = await asyncio.wait_for(reader.readexactly(2), PING_LATE_S)
            assert answer == b"\xd0\x00", answer
            rtts.append((time.perf_counter() - sent) * 1e3)
        except asyncio.TimeoutError:
            late += 1
            rtts.append(PING_LATE_S * 1e3)
        except (OSError, asyncio.IncompleteReadError):
            dropped += 1
            connected = False
            continue
        await asyncio.sleep(PING_EVERY_S)
    writer.transport.abort()
    return {"rtts": rtts, "late": late, "dropped": dropped, "refused": refused}


def _rss_kib(pid: int, field: str = "VmRSS") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def _phase(name: str, target: dict, attack: list[str] | None, seconds: float, fresh_login: bool) -> dict:
    stop = asyncio.Event()
    pinger = asyncio.create_task(_pinger(target["host"], target["port"], target["user"], stop))
    await asyncio.sleep(0.5)  # logged in before the flood starts
    proc = None
    if attack is not None:
        proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--attack", *attack,
                                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak, login = 0, None
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < deadline:
        peak = max(peak, _rss_kib(target["pid"]))
        if fresh_login and login is None and time.monotonic() - started > seconds / 3:
            t0 = time.perf_counter()
            try:
                _, w, code = await _login(target["host"], target["port"], "legit-fresh", FRESH_USER)
                w.transport.abort()
                login = {"code": code, "s": time.perf_counter() - t0}
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
                login = {"code": None, "s": time.perf_counter() - t0, "error": type(exc).__name__}
        await asyncio.sleep(0.1)
    attacker = {}
    if proc is not None:
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), seconds + 60)
            attacker = json.loads(out or b"{}")
        except asyncio.TimeoutError:
            proc.kill()
            attacker = {"error": "the attacker did not finish"}
    stop.set()
    pings = await asyncio.wait_for(pinger, PING_LATE_S + 35)
    rtts = sorted(pings["rtts"]) or [float("nan")]
    result = {"phase": name, "target": target["name"], "pings": len(pings["rtts"]),
              "p50_ms": rtts[len(rtts) // 2], "p99_ms": rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))],
              "late": pings["late"], "dropped": pings["dropped"], "relogins_refused": pings["refused"],
              "rss_peak_mib": peak / 1024,
              "attacker": attacker, "fresh_login": login}
    print(f"flood: {name} on {target['name']}: {json.dumps(result)}", file=sys.stderr, flush=True)
    return result


def _attacks(args, host: str, mqtt_port: int, api_port: int) -> dict[str, list[str] | None]:
    s = str(args.phase_s)
    return {
        "no flood": None,
        f"{args.half_connects} half-sent CONNECTs ({args.half_bytes // 1024} KiB each)":
            ["half_connect", host, str(mqtt_port), s, str(args.half_connects), str(args.half_bytes)],
        f"wrong passwords, {args.password_workers} workers":
            ["wrong_password", host, str(mqtt_port), s, str(args.password_workers), "0"],
        f"8080: {args.slowloris} slowloris + {args.idle} idle":
            ["slowloris", host, str(api_port), s, str(args.slowloris), str(args.idle)],
        # last: on a decoder that is not linear this one stalls the node and may move activity
        f"{args.big_connects} CONNECTs of {args.big_props:,} empty User Properties":
            ["big_connect", host, str(mqtt_port), s, str(args.big_connects), str(args.big_props)],
    }


def flood_part(args) -> tuple[list[dict], dict]:
    workdir = Path(tempfile.mkdtemp(prefix="pairmq-hostile-"))
    try:
        return _flood(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _flood(args, workdir: Path) -> tuple[list[dict], dict]:
    from pairmq.appliance.broker.access import AccessPolicy, hash_password
    from pairmq.appliance.roles import Role
    from tests.harness.group import Group

    results, group_info = [], {}
    policy = AccessPolicy(False, {u: hash_password(PASSWORD, os.urandom(16)) for u in (USER, FRESH_USER)})
    with Group(workdir / "pairmq", access=policy) as g:
        g.start()
        g.wait_for("the primary to take activity", lambda: g.active() is Role.PRIMARY, timeout_s=60)
        g.wait_for("the backup to be in sync", g.backup_in_sync, timeout_s=60)
        before = [d for r in (Role.PRIMARY, Role.BACKUP) for d in g.decisions(r)]
        host = g.address(Role.PRIMARY)
        target = {"name": "pairmq", "host": host, "port": g.config.ports.mqtt, "pid": g.pid(Role.PRIMARY),
                  "user": USER}
        for name, attack in _attacks(args, host, g.config.ports.mqtt, g.config.ports.management).items():
            results.append(asyncio.run(_phase(name, target, attack, args.phase_s, attack is not None
                                              and attack[0] == "wrong_password")))
        after = [d for r in (Role.PRIMARY, Role.BACKUP) for d in g.decisions(r)]
        moved = [d["reason"] for d in after[len(before):] if d["kind"] in ("activate", "step_down")]
        group_info = {"active_at_end": g.active().value if g.active() else None, "activity_moves": moved,
                      "vm_hwm_mib": _rss_kib(g.pid(Role.PRIMARY), "VmHWM") / 1024}
    if args.peer:
        from bench.brokers import run_mosquitto

        with run_mosquitto(workdir, persist=False) as m:
            peer = {"name": "mosquitto", "host": m.host, "port": m.port, "pid": m.pid, "user": None}
            half = [k for k in _attacks(args, m.host, m.port, 0) if "half-sent" in k][0]
            for name in ("no flood", half):
                attack = _attacks(args, m.host, m.port, 0)[name]
                results.append(asyncio.run(_phase(name, peer, attack, args.phase_s, False)))
            group_info["mosquitto_vm_hwm_mib"] = _rss_kib(m.pid, "VmHWM") / 1024
    return results, group_info


# --- the report ------------------------------------------------------------------------------------------

def report(codec: list[dict], flood: list[dict], info: dict, args, started: str) -> str:
    from bench.report import machine

    command = ".venv/bin/python bench/hostile.py " + " ".join(args.argv)
    lines = [DOC_BEGIN, "## Hostile input (bench/hostile.py)", "", "```", command.strip(), "```", "",
             f"- Date: {started}", f"- Machine: {machine()}", ""]
    if codec:
        lines += ["Decoding cost by packet size (the broker's PacketReader; CPU per packet, best of the "
                  "repetitions). Exponent: CPU ∝ bytes^k fitted over the sizes (1 = linear); ratio: µs/byte at "
                  "the largest size ÷ at the smallest (1 = flat).", "",
                  "| packet | sizes (n) | bytes, largest | µs/byte, smallest → largest | exponent | ratio |",
                  "|---|---|---:|---|---:|---:|"]
        for row in codec:
            pts = row["points"]
            sizes = ", ".join(f"{p['n']:,}" for p in pts)
            lines.append(f"| {row['case']} | {sizes} | {pts[-1]['bytes']:,} | "
                         f"{pts[0]['us_per_byte']:.3f} → {pts[-1]['us_per_byte']:.3f} | {row['exponent']:.2f} | "
                         f"{row['ratio']:.1f}× |")
        lines.append("")
    if flood:
        lines += [f"Pre-auth floods, {args.phase_s:g} s each, against the active primary (anonymous refused, two "
                  "users), each from its own loopback address (the primary's + 7); a legitimate client logged in before the "
                  "flood pings every 50 ms from another. Goal: PINGREQ p99 < "
                  f"{GOAL_P99_MS:.0f} ms, activity never moves, primary RSS < {GOAL_RSS_MIB} MiB.", "",
                  "| broker | phase | pings | p50 ms | p99 ms | late (>2 s) | dropped / logins refused | RSS peak MiB "
                  "| attacker saw |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in flood:
            seen = ", ".join(f"{k} {v}" for k, v in r["attacker"].items())
            if r["fresh_login"]:
                fl = r["fresh_login"]
                seen += f"; a first correct login of another user: CONNACK {fl['code']} after {fl['s']:.2f} s"
            lines.append(f"| {r['target']} | {r['phase']} | {r['pings']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                         f"{r['late']} | {r['dropped']} / {r['relogins_refused']} | {r['rss_peak_mib']:.0f} | "
                         f"{seen or '—'} |")
        moves = info.get("activity_moves") or []
        worst = max((r["p99_ms"] for r in flood if r["target"] == "pairmq"), default=float("nan"))
        peak = max((r["rss_peak_mib"] for r in flood if r["target"] == "pairmq"), default=0.0)
        lines += ["", f"- Activity: {'moved: ' + '; '.join(moves) if moves else 'never moved'} "
                      f"(active at the end: {info.get('active_at_end')}).",
                  f"- PairMQ primary VmHWM at the end: {info.get('vm_hwm_mib', 0):.0f} MiB"
                  + (f"; mosquitto's: {info['mosquitto_vm_hwm_mib']:.0f} MiB." if "mosquitto_vm_hwm_mib" in info
                     else "."),
                  f"- Goals: p99 < {GOAL_P99_MS:.0f} ms in every phase: worst {worst:.1f} ms — "
                  f"{'**met**' if worst < GOAL_P99_MS else '**missed**'}; activity never moves — "
                  f"{'**met**' if not moves else '**missed**'}; RSS < {GOAL_RSS_MIB} MiB: peak {peak:.0f} MiB — "
                  f"{'**met**' if peak < GOAL_RSS_MIB else '**missed**'}."]
    lines += ["", DOC_END]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--attack":
        attack_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("codec", "flood", "both"), default="both")
    parser.add_argument("--codec-cap-s", type=float, default=5.0, help="last size: one decode over this CPU")
    parser.add_argument("--phase-s", type=float, default=12.0, help="duration of each flood phase")
    parser.add_argument("--half-connects", type=int, default=300)
    parser.add_argument("--half-bytes", type=int, default=256 * 1024, help="bytes of each half-sent CONNECT")
    parser.add_argument("--password-workers", type=int, default=100)
    parser.add_argument("--slowloris", type=int, default=300)
    parser.add_argument("--idle", type=int, default=1000, help="silent connections to 8080")
    parser.add_argument("--big-connects", type=int, default=2, help="whole CONNECTs with many User Properties")
    parser.add_argument("--big-props", type=int, default=60_000, help="User Properties in each of them")
    parser.add_argument("--no-peer", dest="peer", action="store_false", help="skip mosquitto")
    parser.add_argument("--write-docs", action="store_true", help="replace the hostile block in docs/benchmarks.md")
    args = parser.parse_args()
    args.argv = [a for a in sys.argv[1:] if a != "--write-docs"]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    codec = codec_part(args.codec_cap_s) if args.part in ("codec", "both") else []
    flood, info = flood_part(args) if args.part in ("flood", "both") else ([], {})
    text = report(codec, flood, info, args, started)
    print(text)
    if args.write_docs:
        from bench.report import write_docs

        print(f"wrote {write_docs(text, DOC_BEGIN, DOC_END)}", file=sys.stderr)


if __name__ == "__main__":
    main()
