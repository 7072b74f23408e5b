"""What a bench.wave_sim run measured (its Outcome), summarised and printed as Figures: first report ->
decision and -> approval percentiles, approvals per event, the budget's peak, lost races, Storage requests,
CPU per 1,000 envelopes, and item 4's ratio of `--instances` against one (issue 24)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Set, Tuple

from bench import Figure, percentile
from bench.table_model import Model


@dataclass
class Outcome:
    first_report: Dict[str, float] = field(default_factory=dict)
    first_decision: Dict[str, float] = field(default_factory=dict)
    approved: Dict[str, List[float]] = field(default_factory=dict)
    ended: Dict[str, float] = field(default_factory=dict)  # when the VM reported the event gone (its end)
    processed: Dict[str, float] = field(default_factory=dict)  # when the call that took that report ended
    scale_set: Dict[str, str] = field(default_factory=dict)
    started: Set[str] = field(default_factory=set)  # events whose start is played (approved, or by Azure)
    calls: int = 0
    envelopes: int = 0  # envelopes delivered to ingest (the per-1,000-envelopes base of item 4's ratio)
    invocation_cpu: float = 0.0  # thread CPU inside central's calls (what the instances' work costs)
    cut_at: float = -1.0  # virtual time the real-time bound stopped the run at (-1: it finished)
    cpu: float = 0.0  # process CPU seconds of the run (the machine is shared: real seconds are not its cost)
    store_cpu: float = 0.0  # of which the in-memory stand-in answering (nan on Azurite)


def _pct(values: List[float], q: float) -> float:
    return percentile(values, q) if values else float("nan")


def budget_peak(out: Outcome, ends: Dict[str, float]) -> int:
    """The most VMs of one scale set impacted at once: from the approval's send to `ends`."""
    peak: Dict[str, int] = {}
    edges: Dict[str, List[Tuple[float, int]]] = {}
    for e, times in out.approved.items():
        edges.setdefault(out.scale_set[e], []).append((times[0], 1))
        edges[out.scale_set[e]].append((ends.get(e, float("inf")), -1))
    for group, points in edges.items():
        level = 0
        for _, step in sorted(points, key=lambda p: (p[0], p[1])):
            level += step
            peak[group] = max(peak.get(group, 0), level)
    return max(peak.values() or [0])


def summarize(out: Outcome, args: argparse.Namespace, services: List[Any], model: Model) -> Dict[str, float]:
    first = [out.first_decision[e] - out.first_report[e] for e in out.first_decision if e in out.first_report]
    approval = [v[0] - out.first_report[e] for e, v in out.approved.items()]
    return {
        "cpu_s": out.cpu, "store_cpu_s": out.store_cpu,
        "events": args.events, "decided": len(out.first_decision), "approved": len(out.approved),
        "ended": len(out.ended), "calls": out.calls, "cut_at": out.cut_at,
        "envelopes": out.envelopes, "invocation_cpu_s": out.invocation_cpu,
        "decision_p50": _pct(first, 50), "decision_p99": _pct(first, 99),
        "approval_p50": _pct(approval, 50), "approval_p99": _pct(approval, 99),
        "approved_twice": sum(1 for v in out.approved.values() if len(v) > 1),
        "budget_peak": budget_peak(out, out.ended), "budget_peak_processed": budget_peak(out, out.processed),
        "lost_races": sum(s.counters["conflicts"] for s, _ in services),
        "requests": sum(t.requests for _, t in services), "throttled": model.throttled,
        "latency_p50_ms": 1000 * _pct(model.samples, 50),
        "latency_p99_ms": 1000 * _pct(model.samples, 99),
        "azurite_p50_ms": 1000 * _pct(model.measured, 50),
        "azurite_p99_ms": 1000 * _pct(model.measured, 99),
    }


def report(label: str, r: Dict[str, float], real_s: float, budget: int) -> List[Figure]:
    if r["cut_at"] >= 0:
        print(f"{label}: STOPPED by --max-real-seconds at virtual {r['cut_at']:.0f} s")
    print(f"{label}: {int(r['events'])} events, {int(r['decided'])} decided, {int(r['approved'])} approved, "
          f"{int(r['ended'])} ended in {int(r['calls'])} calls; first report -> decision p50 "
          f"{r['decision_p50']:.2f} s, p99 {r['decision_p99']:.2f} s; -> approval p50 "
          f"{r['approval_p50']:.1f} s, "
          f"p99 {r['approval_p99']:.1f} s; approved twice {int(r['approved_twice'])}; most of a scale set "
          f"impacted at once {int(r['budget_peak'])} (budget {budget}; {int(r['budget_peak_processed'])} "
          f"counting each until the end of the call that took its end); lost races {int(r['lost_races'])}; "
          f"Storage requests {int(r['requests'])}, throttled {int(r['throttled'])}; charged latency p50/p99 "
          f"{r['latency_p50_ms']:.1f}/{r['latency_p99_ms']:.1f} ms (the service's own, wall-clock "
          f"{r['azurite_p50_ms']:.1f}/{r['azurite_p99_ms']:.1f} ms); {real_s:.0f} s real, "
          f"{r['cpu_s']:.0f} s CPU (stand-in {r['store_cpu_s']:.1f} s); per 1,000 envelopes "
          f"({int(r['envelopes'])}): {per_thousand(r, 'invocation_cpu_s'):.2f} s CPU inside central's calls, "
          f"{per_thousand(r, 'requests'):.0f} Storage round trips")
    return [
        Figure("wave_sim", f"{label}: first report -> decision p99", round(r["decision_p99"], 2), "s", "<= 5",
               r["decision_p99"] <= 5),
        Figure("wave_sim", f"{label}: first report -> decision p50", round(r["decision_p50"], 2), "s"),
        Figure("wave_sim", f"{label}: events approved twice", int(r["approved_twice"]), "events", "<= 0",
               r["approved_twice"] <= 0),
        Figure("wave_sim", f"{label}: most VMs of a scale set impacted at once (budget {budget})",
               int(r["budget_peak"]), "VMs", f"<= {budget}", r["budget_peak"] <= budget),
        Figure("wave_sim", f"{label}: commits that lost a race", int(r["lost_races"]), "commits"),
        Figure("wave_sim", f"{label}: Storage requests per event", round(r["requests"] / r["events"], 1),
               "requests"),
        Figure("wave_sim", f"{label}: throttled Storage requests", int(r["throttled"]), "requests"),
        Figure("wave_sim", f"{label}: real seconds", round(real_s, 1), "s"),
        Figure("wave_sim", f"{label}: CPU seconds", round(r["cpu_s"], 1), "s"),
        Figure("wave_sim", f"{label}: CPU inside central's calls per 1,000 envelopes",
               round(per_thousand(r, "invocation_cpu_s"), 3), "s"),
        Figure("wave_sim", f"{label}: Storage round trips per 1,000 envelopes",
               round(per_thousand(r, "requests"), 1), "requests"),
    ]


def per_thousand(r: Dict[str, float], key: str) -> float:
    return 1000 * r[key] / r["envelopes"] if r["envelopes"] else float("nan")


def ratios(many: Dict[str, float], one: Dict[str, float]) -> Tuple[float, float]:
    """Item 4's ratios of two runs of the same seeded wave, per 1,000 envelopes: (CPU inside central's calls,
    Storage round trips) of `many` instances against `one`."""
    return (per_thousand(many, "invocation_cpu_s") / per_thousand(one, "invocation_cpu_s"),
            per_thousand(many, "requests") / per_thousand(one, "requests"))


def compare(label: str, many: Dict[str, float], one: Dict[str, float], instances: int,
            played: str) -> List[Figure]:
    """Item 4's ratio: `instances` instances against one on the same seeded wave, per 1,000 envelopes
    (`played`: how the two runs were played, side by side or one after the other)."""
    cpu, trips = ratios(many, one)
    print(f"{label}: {instances} instances vs 1 ({played}), per 1,000 envelopes: CPU inside central's calls "
          f"x{cpu:.2f}, Storage round trips x{trips:.2f} (goal <= x1.10)")
    return [Figure("wave_sim", f"{label}: CPU per 1,000 envelopes, {instances} instances vs 1", round(cpu, 3),
                   "x", "<= 1.10", cpu <= 1.10),
            Figure("wave_sim",
                   f"{label}: Storage round trips per 1,000 envelopes, {instances} instances vs 1",
                   round(trips, 3), "x", "<= 1.10", trips <= 1.10)]
