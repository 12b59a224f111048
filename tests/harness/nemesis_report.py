"""The nemesis's per-run report: one JSON document and a readable table, from recorded outcomes (no I/O but `write`).

Rules:
1. Every count the issue names is always present, zeros included: lost acknowledged messages, QoS 2
   duplicates, order violations, dual acceptance from the nodes' event logs and from the probes, node
   crashes (a node process that exited without being killed), recovery timeouts, and faults the nemesis
   failed to inject (a run that tested less than its schedule says is no pass). Any of them non-zero
   makes the run fail (`violations`).
2. QoS 1 duplicates and publishes refused with a reason code (e.g. 0x97 on a full spool) are reported,
   not violations: MQTT allows the first, and the second is the clean refusal a full disk must give.
3. Unavailability is per step: the longest stretch, over every publisher, without an acknowledgement
   from the fault's start until the group had recovered (tests/harness/streams.py `longest_gap`). Per kind the
   table shows the count injected, p50 and max.
"""

from __future__ import annotations

import collections
import json
import statistics
from pathlib import Path

VIOLATIONS = ("lost", "duplicates_qos2", "order_violations", "unknown", "dual_accept_event_log",
              "dual_accept_probes", "node_crashes", "recovery_timeouts", "injection_failures")


def _p50_max(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return round(statistics.median(values), 3), round(max(values), 3)


def build(runs: list[dict]) -> dict:
    """`runs`: one dict per seed (tests/harness/nemesis.py `Run.result`); the report sums them."""
    totals = {key: 0 for key in ("steps", "published", "acknowledged", "refused", "received",
                                 "duplicates_qos1", "duplicates_msgid", "probe_rounds",
                                 "probe_suspects_explained", *VIOLATIONS)}
    per_kind: dict[str, dict] = {}
    per_target: dict[str, dict] = {}  # "kill9 active", "one_way standby->client", ...
    failed_seeds = []
    codes: collections.Counter = collections.Counter()
    for run in runs:
        for key in totals:
            totals[key] += run["counts"].get(key, 0)
        codes.update(run["counts"].get("refused_codes", {}))
        if any(run["counts"].get(key, 0) for key in VIOLATIONS) or run.get("error"):
            failed_seeds.append(run["seed"])
        for step in run["steps"]:
            arrow = "->" if step["kind"] == "one_way" else "-"
            target = f"{step['kind']} {arrow.join(step.get('target', ()))}".strip()
            for table_, key in ((per_kind, step["kind"]), (per_target, target)):
                kind = table_.setdefault(key, {"injected": 0, "unavailable_s": [], "recover_s": [],
                                               "recovery_timeouts": 0})
                kind["injected"] += 1
                if step.get("unavailable_s") is not None:
                    kind["unavailable_s"].append(step["unavailable_s"])
                if step.get("recover_s") is not None:
                    kind["recover_s"].append(step["recover_s"])
                kind["recovery_timeouts"] += 0 if step.get("recovered", True) else 1
    totals["refused_codes"] = dict(sorted(codes.items()))
    return {"seeds": [run["seed"] for run in runs], "failed_seeds": failed_seeds, "totals": totals,
            "per_kind": _summary(per_kind), "per_kind_and_target": _summary(per_target), "runs": runs,
            "ok": not failed_seeds and not any(totals[key] for key in VIOLATIONS)}


def _summary(per_kind: dict[str, dict]) -> dict[str, dict]:
    summary = {}
    for name, kind in sorted(per_kind.items()):
        p50, worst = _p50_max(kind["unavailable_s"])
        r50, rmax = _p50_max(kind["recover_s"])
        summary[name] = {"injected": kind["injected"], "unavailable_p50_s": p50, "unavailable_max_s": worst,
                         "recover_p50_s": r50, "recover_max_s": rmax, "recovery_timeouts": kind["recovery_timeouts"]}
    return summary


def _rows(title: str, per: dict[str, dict], width: int) -> list[str]:
    def fmt(value) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [f"{title:<{width}}{'injected':>9}{'unavail p50 s':>15}{'unavail max s':>15}"
             f"{'recover p50 s':>15}{'recover max s':>15}"]
    for name, k in per.items():
        lines.append(f"{name:<{width}}{k['injected']:>9}{fmt(k['unavailable_p50_s']):>15}"
                     f"{fmt(k['unavailable_max_s']):>15}{fmt(k['recover_p50_s']):>15}{fmt(k['recover_max_s']):>15}")
    return lines


def table(report: dict, by_target: bool = False) -> str:
    """The per-kind table and the totals; `by_target` adds the table per kind and (symbolic) target."""
    lines = _rows("fault kind", report["per_kind"], 18)
    if by_target:
        lines += ["", *_rows("fault kind and target", report["per_kind_and_target"], 32)]
    t = report["totals"]
    lines.append("")
    lines.append(f"seeds {report['seeds']}: {t['steps']} steps; published {t['published']}, acknowledged "
                 f"{t['acknowledged']}, refused with a reason code {t['refused']} {t['refused_codes'] or ''}, received {t['received']} "
                 f"(distinct, summed over persistent subscribers), QoS 1 duplicates {t['duplicates_qos1']} (allowed; "
                 f"{t['duplicates_msgid']} of them from the message-id publisher), "
                 f"probe rounds {t['probe_rounds']} ({t['probe_suspects_explained']} rounds with two CONNACK 0 explained "
                 f"by the logs: activity moved between the two accepts)")
    lines.append("violations: " + ", ".join(f"{key} {t[key]}" for key in VIOLATIONS))
    lines.append("result: " + ("OK, zero violations" if report["ok"] else
                               f"FAILED; seeds to rerun with --seed: {report['failed_seeds']}"))
    for run in report["runs"]:
        for problem in run.get("problems", [])[:10]:
            lines.append(f"  seed {run['seed']}: {problem}")
        if run.get("error"):
            lines.append(f"  seed {run['seed']}: {run['error']}")
    return "\n".join(lines)


def write(report: dict, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, text_path = directory / "nemesis-report.json", directory / "nemesis-report.txt"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    text_path.write_text(table(report, by_target=True) + "\n")
    return json_path, text_path
