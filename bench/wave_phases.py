"""Where item 4's overhead goes (issue 24): bench.wave_sim's 4 instances against 1, central's CPU by phase.

    python -m bench.wave_phases [--vms 10000] [--events 1000] [--runs 3]

Plays the seeded wave of bench.wave_sim with 4 instances and with 1, side by side (bench.side_by_side), on the
in-memory stand-in, and charges the thread CPU inside central's calls to the phases below: each phase's own
time, its callees that are phases themselves left out, the stand-in's answering left out (as bench.wave_sim
leaves it out of central's CPU). The phases are central's functions, wrapped for the play and restored after:
a wrapper's own cost lands in the caller's phase, alike on both sides. Prints, per phase, the CPU of each
side, the difference and the calls; with `--runs`, the median [min-max] of each difference, and the extra
work priced. A diagnostic, not a goal: `python -m bench` does not run it (IN_BENCH).

`--route vm` plays the forwarder's partition key before issue 24's group tags (each VM by its vmId): every
instance then decides in every scale set, and reads what the others change in it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from statistics import median
from typing import Any, Callable, Dict, Iterator, List, Tuple

from bench import side_by_side, table_memory_net, wave_sim
from bench.table_memory import MemoryStorage
from bench.table_model import Model
from bench.wave_report import per_thousand, ratios

IN_BENCH = False  # bench.__main__: a diagnostic (minutes, and it measures no goal)
REST = "the rest of the call"  # the call's CPU no phase below took (service dispatch, parsing, metrics...)


def _phases() -> List[Tuple[Any, str, str]]:
    """(owner, attribute, phase name) for every phase: central's methods and the module functions it calls
    by module attribute (state_rows.event_from_entity, head_log.read), so wrapping the attribute reaches
    every caller."""
    from central.intake.plan import Planner
    from central.runtime.act import Actor
    from central.runtime.evaluator import Evaluator
    from central.runtime.ingest import Ingest
    from central.runtime.inline import WaitingGroups
    from central.runtime.service import CentralService
    from central.store import head_log, state_rows
    from central.store.event_reads import EventReads
    from central.store.fleet_state import FleetState
    from central.store.tables import TableLog
    from central.store.vm_reads import VmReads

    return [
        (CentralService, "handle_batch", REST), (CentralService, "reevaluate", "the timer's pass"),
        (Ingest, "_prepare", "reads before planning"), (FleetState, "read_for_plan", "reads before planning"),
        (EventReads, "_read_head", "the head's read"), (VmReads, "read_rows", "reads by key (queries)"),
        (VmReads, "install_vms", "VM rows cached"),
        (state_rows, "event_from_entity", "event records built"),
        (state_rows, "vm_from_entity", "VM records built"),
        (head_log, "read", "the head's logs parsed"), (EventReads, "_hold_head", "the head held"),
        (EventReads, "_changed_since", "the head's log compared"),
        (Planner, "plan", "planning"), (Evaluator, "decide_planned", "deciding"),
        (WaitingGroups, "follow", "waiting events re-indexed"),
        (FleetState, "commit", "commits"), (Actor, "act", "acting (approval sends)"),
        (TableLog, "flush", "log rows written"),
    ]


class Ledger:
    """Each phase's own thread CPU and calls; `answering` is the stand-in's CPU so far (taken out)."""

    def __init__(self, answering: Callable[[], float]) -> None:
        self.answering = answering
        self.cpu: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._inner: List[float] = []  # per open phase: the time its callees that are phases took

    def wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started, answered = time.thread_time(), self.answering()
            self._inner.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - started - (self.answering() - answered)
                inner = self._inner.pop()
                self.cpu[phase] += spent - inner
                self.calls[phase] += 1
                if self._inner:
                    self._inner[-1] += spent

        return timed


@contextlib.contextmanager
def phases_timed(ledger: Ledger) -> Iterator[Ledger]:
    """Every phase wrapped for the block, restored after (also when it raises)."""
    saved = []
    for owner, name, phase in _phases():
        original = owner.__dict__[name]  # (the class's own function, not an inherited one)
        saved.append((owner, name, original))
        setattr(owner, name, ledger.wrap(original, phase))
    try:
        yield ledger
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def measure(args: argparse.Namespace, instances: int, tag: str) -> Dict[str, Any]:
    """One play of the wave: its figures (bench.wave_sim's) and central's CPU and calls by phase."""
    run = argparse.Namespace(**{**vars(args), "instances": instances})
    storage = MemoryStorage()
    with phases_timed(Ledger(lambda: storage.cpu)) as ledger:
        figures = wave_sim.simulate(run, table_memory_net.connection_string(), Model(), tag, storage)
    return {"figures": figures, "cpu": dict(ledger.cpu), "calls": dict(ledger.calls)}


def priced(figures: Dict[str, Any]) -> float:
    """USD of central's work in a play, priced as bench.fleet_cost prices it: Flex Consumption GB-s for the
    calls' CPU plus each Storage request at the model's mean Azure latency, at infra's instance memory, and
    each request as a Table transaction (bench.azure_prices: the GB-s price cited, the Table one assumed)."""
    from bench.azure_prices import PRICES
    from bench.fleet_cost import STORAGE_MEAN_S, instance_memory_gb

    busy = figures["invocation_cpu_s"] + figures["requests"] * STORAGE_MEAN_S
    return (busy * instance_memory_gb() * PRICES["fx_gb_s"].usd
            + figures["requests"] / 10_000 * PRICES["table_10k"].usd)


def pair(sim: argparse.Namespace) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """4 instances and 1, side by side."""
    return side_by_side.run(lambda: measure(sim, 4, "m"), measure, sim, 1, "o")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wave_phases", description=__doc__.split("\n")[0])
    parser.add_argument("--vms", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--route", choices=("vm", "scale-set"), default="scale-set",
                        help="the simulated forwarders' partition key (bench.wave_sim --route)")
    args = parser.parse_args(argv)
    sim = wave_sim.parser().parse_args(["--vms", str(args.vms), "--events", str(args.events),
                                        "--max-real-seconds", "600", "--route", args.route])
    diffs: Dict[str, List[float]] = {}
    extra_usd: List[float] = []
    for run in range(args.runs):
        many, one = pair(sim)
        m, o = many["figures"], one["figures"]
        m1k, o1k = per_thousand(m, "invocation_cpu_s"), per_thousand(o, "invocation_cpu_s")
        cpu_ratio, trips_ratio = ratios(m, o)
        sums = sum(many["cpu"].values()), sum(one["cpu"].values())
        print(f"run {run + 1}: per 1,000 envelopes, CPU inside central's calls {m1k:.3f} s (4 instances) "
              f"vs {o1k:.3f} s (1), x{cpu_ratio:.2f}; Storage round trips x{trips_ratio:.2f} "
              f"({m['requests']} vs {o['requests']} requests); the phases' sum {sums[0]:.2f} vs "
              f"{sums[1]:.2f} s of {m['invocation_cpu_s']:.2f} vs {o['invocation_cpu_s']:.2f} s;"
              f" 4 instances: {m['decided']} decided, {m['approved']} approved, {m['ended']} ended, "
              f"{m['approved_twice']} approved twice, budget peak {m['budget_peak']}, {m['lost_races']} lost "
              "races", flush=True)
        extra_usd.append((priced(m) - priced(o)) / args.events * 1000)
        for phase in sorted(set(many["cpu"]) | set(one["cpu"]),
                            key=lambda p: -(many["cpu"].get(p, 0.0) - one["cpu"].get(p, 0.0))):
            a, b = many["cpu"].get(phase, 0.0), one["cpu"].get(phase, 0.0)
            diffs.setdefault(phase, []).append(a - b)
            print(f"  {phase:30s} {a:6.2f} s vs {b:6.2f} s  {a - b:+6.2f} s   calls "
                  f"{many['calls'].get(phase, 0)} vs {one['calls'].get(phase, 0)}", flush=True)
    print(f"\n{args.vms} VMs, {args.events} events: 4 instances' extra CPU by phase, median [min-max] of "
          f"{args.runs} (side by side):")
    for phase, values in sorted(diffs.items(), key=lambda kv: -median(kv[1])):
        print(f"  {phase:30s} {median(values):+6.2f} s [{min(values):+.2f} to {max(values):+.2f}]")
    print(f"  what the 4 instances' extra work costs, priced as bench.fleet_cost prices it: USD "
          f"{median(extra_usd):.5f} [{min(extra_usd):.5f}-{max(extra_usd):.5f}] per 1,000 events")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
