"""MQTT CONNECT probe: asks every node, at the same instants, "would you serve me?".

Run as a program (so it can live in a test host's network namespace):
    python -m tests.harness.probe --hosts 10.77.0.1,10.77.0.2 --interval-ms 15 --duration-s 5 --out FILE [--stop-file F]
    python -m tests.harness.probe --hosts ... --once            (one round, JSON on stdout)
Each round sends an MQTT 3.1.1 CONNECT to every host at once and records the
CONNACK return code (0 = accepted, 3 = server unavailable, null = no answer).
Rounds never wait for each other, so a node paused with SIGSTOP cannot slow
the sampling of the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

CONNECT_311 = bytes([0x10, 16, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 30, 0, 4]) + b"prob"


def now_ms() -> float:
    return time.monotonic_ns() / 1e6


async def connack(host: str, port: int = 1883, timeout_s: float = 3.0) -> int | None:
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        writer.write(CONNECT_311)
        answer = await asyncio.wait_for(reader.readexactly(4), timeout_s)
        return answer[3] if answer[0] == 0x20 else None
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        return None
    finally:
        if writer is not None:
            writer.close()


async def one_round(hosts: list[str], timeout_s: float = 3.0) -> dict[str, int | None]:
    codes = await asyncio.gather(*(connack(h, timeout_s=timeout_s) for h in hosts))
    return dict(zip(hosts, codes))


async def sample(hosts: list[str], interval_ms: float, duration_s: float, stop_file: str | None = None) -> list[dict]:
    """Rounds every `interval_ms` for `duration_s`, or until `stop_file` exists: then the rounds under way finish
    and are kept (the nemesis ends its last chunk with the schedule rather than sample an idle group)."""
    rounds: list[dict] = []

    async def probe(tick: int, host: str) -> None:
        sent = now_ms()
        rc = await connack(host)
        rounds.append({"tick": tick, "host": host, "sent_ms": sent, "done_ms": now_ms(), "rc": rc})

    tasks = []
    start = time.monotonic()
    tick = 0
    while time.monotonic() - start < duration_s and not (stop_file and os.path.exists(stop_file)):
        tasks += [asyncio.create_task(probe(tick, h)) for h in hosts]
        tick += 1
        await asyncio.sleep(interval_ms / 1000)
    await asyncio.gather(*tasks)
    return sorted(rounds, key=lambda r: (r["tick"], r["host"]))


def double_service(rounds: list[dict]) -> list[int]:
    """Ticks at which two or more nodes accepted the same instant's CONNECT."""
    accepted: dict[int, int] = {}
    for r in rounds:
        if r["rc"] == 0:
            accepted[r["tick"]] = accepted.get(r["tick"], 0) + 1
    return sorted(t for t, n in accepted.items() if n > 1)


CONNECT_V5 = bytes([0x10, 17, 0, 4]) + b"MQTT" + bytes([5, 2, 0, 30, 0, 0, 4]) + b"hold"


async def hold(host: str, seconds: float) -> dict:
    """Connect as an MQTT 5 client and wait to be dropped: how and when (monotonic ms)."""
    reader, writer = await asyncio.open_connection(host, 1883)
    writer.write(CONNECT_V5)
    connack = await reader.readexactly(2)
    body = await reader.readexactly(connack[1])
    result = {"connack_rc": body[1], "connected_ms": now_ms(), "dropped_ms": None, "disconnect_rc": None}
    try:
        first = await asyncio.wait_for(reader.read(1), seconds)
    except asyncio.TimeoutError:
        writer.close()
        return result  # never dropped
    except ConnectionError:
        first = b""
    result["dropped_ms"] = now_ms()
    if first == b"\xe0":  # DISCONNECT: remaining length, then the reason code
        length = (await reader.readexactly(1))[0]
        payload = await reader.readexactly(length) if length else b""
        result["disconnect_rc"] = payload[0] if payload else 0
    writer.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--interval-ms", type=float, default=15)
    parser.add_argument("--duration-s", type=float, default=5)
    parser.add_argument("--out")
    parser.add_argument("--stop-file", help="end the sampling early once this file exists")
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--hold-s", type=float, help="connect (MQTT 5) to the first host and report how it was dropped")
    args = parser.parse_args(argv)
    hosts = args.hosts.split(",")
    if args.hold_s:
        print(json.dumps(asyncio.run(hold(hosts[0], args.hold_s))), flush=True)
        return 0
    if args.once:
        print(json.dumps(asyncio.run(one_round(hosts, timeout_s=1.0))))
        return 0
    rounds = asyncio.run(sample(hosts, args.interval_ms, args.duration_s, args.stop_file))
    text = "\n".join(json.dumps(r) for r in rounds) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0




if __name__ == "__main__":
    sys.exit(main())
