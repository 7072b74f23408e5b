"""What item 4's overhead consists of (issue 24): bench.wave_sim's 4 instances against 1, played three ways.

    python -m bench.wave_overhead [--vms 10000] [--events 1000] [--runs 3]

Each way plays the same seeded wave with 4 instances and with 1 (bench.wave_sim, the in-memory stand-in,
`--compare-one`'s ratio: CPU inside central's calls and Storage round trips per 1,000 envelopes):
1. `as played`: as bench.wave_sim plays it.
2. `collector off`: Python's cyclic garbage collector disabled for the runs. In the simulation it walks the
   four instances' caches, the stand-in's rows and the simulated fleet in one process, and charges each pass
   to whichever call it interrupts; in Azure each instance is a process of its own and the rows are the
   service's.
3. `changes free`: as 2, and the rows a catch-up reads (the active-event rows another instance changed, named
   by the head's log) come from the stand-in's memory without a request, their conversion to entities not
   charged: what reading others' changes would cost at best if they rode in the head's own read. Turning
   them into records (central.store.state_rows) is still charged.

Each pair runs in a process of its own, its 4-instance and 1-instance plays side by side (bench.side_by_side).
A diagnostic, not a goal: `python -m bench` does not run it (IN_BENCH). It prints each way's ratios, and their
median [min-max] over `--runs`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import subprocess
import sys
import time
from statistics import median
from typing import Any, Dict, Iterable, Iterator, List, Tuple

from bench import side_by_side, table_memory_net, wave_sim
from bench.table_memory import MemoryStorage
from bench.table_model import Model
from bench.wave_report import per_thousand, ratios

IN_BENCH = False  # bench.__main__: not one of `python -m bench`'s runs (minutes, and it measures no goal)
WAYS = ("as played", "collector off", "changes free")


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def changes_free(storage: MemoryStorage) -> Iterator[Dict[str, int]]:
    """Active-event rows read by key come from `storage`'s memory: no request, the stand-in's CPU. Yields the
    count of rows so served (none: the catch-up no longer reads through VmReads.read_rows, and this way
    measures nothing)."""
    from azure.data.tables._deserialize import _convert_to_entity  # (what batch_wire.query converts with)

    from central.store import state_rows
    from central.store.vm_reads import VmReads

    real = VmReads.read_rows
    served = {"rows": 0}

    def read_rows(self: Any, keys: Iterable[str]) -> Dict[str, Tuple[dict, str]]:
        wanted = set(keys)
        changed = {k for k in wanted if k.startswith(state_rows.ACTIVE)}  # only catch-ups read these by key
        found = real(self, wanted - changed) if wanted - changed else {}
        started = time.thread_time()
        table = storage.tables[self.store.name("State")][state_rows.PARTITION]
        for key in changed:
            row = table.rows.get(key)
            if row is not None:
                entity = json.loads(json.dumps(row[0]))  # (a copy, as the wire would give)
                entity["odata.etag"] = row[1]
                found[key] = (dict(_convert_to_entity(entity)), row[1])
                served["rows"] += 1
        storage.cpu += time.thread_time() - started  # charged to the stand-in: excluded from central's
        return found

    VmReads.read_rows = read_rows  # type: ignore[method-assign]
    try:
        yield served
    finally:
        VmReads.read_rows = real  # type: ignore[method-assign]


def play(args: argparse.Namespace, instances: int, way: str, tag: str) -> Dict[str, float]:
    run = argparse.Namespace(**{**vars(args), "instances": instances})
    storage = MemoryStorage()
    with contextlib.ExitStack() as stack:
        if way != WAYS[0]:
            stack.enter_context(collector_off())
        if way == WAYS[2]:
            stack.enter_context(changes_free(storage))
        result = wave_sim.simulate(run, table_memory_net.connection_string(), Model(), tag, storage)
    return result


def pair(sim: argparse.Namespace, way: str) -> Tuple[float, float, float, float]:
    """4 instances and 1 side by side, as `--compare-one` plays them: the ratios, and each CPU figure."""
    many, one = side_by_side.run(lambda: play(sim, 4, way, "m"), play, sim, 1, way, "o")
    cpu, trips = ratios(many, one)
    return cpu, trips, per_thousand(many, "invocation_cpu_s"), per_thousand(one, "invocation_cpu_s")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wave_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--vms", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pair", choices=WAYS, help=argparse.SUPPRESS)  # one pair, in this process
    args = parser.parse_args(argv)
    if args.pair:
        # bench.wave_sim's defaults (on the in-memory stand-in), this wave's size
        sim = wave_sim.parser().parse_args(["--vms", str(args.vms), "--events", str(args.events),
                                            "--max-real-seconds", "600"])
        print(json.dumps(pair(sim, args.pair)))
        return 0
    ratios: Dict[str, List[Tuple[float, float]]] = {way: [] for way in WAYS}
    for run in range(args.runs):
        for way in WAYS:  # each pair in a process of its own: what an earlier one left does not weigh on it
            out = subprocess.run([sys.executable, "-m", "bench.wave_overhead", "--vms", str(args.vms),
                                  "--events", str(args.events), "--pair", way],
                                 capture_output=True, text=True, check=True, timeout=1200)
            cpu, trips, cpu4, cpu1 = json.loads(out.stdout.strip().splitlines()[-1])
            ratios[way].append((cpu, trips))
            print(f"run {run + 1}, {way}: 4 vs 1 CPU x{cpu:.2f}, round trips x{trips:.2f} "
                  f"(CPU per 1,000 envelopes {cpu4:.3f} / {cpu1:.3f} s)", flush=True)
    print(f"\n{args.vms} VMs, {args.events} events, 4 instances vs 1, median [min-max] of {args.runs}:")
    for way in WAYS:
        cpus, trips = [c for c, _ in ratios[way]], [t for _, t in ratios[way]]
        print(f"  {way:14s} CPU x{median(cpus):.2f} [{min(cpus):.2f}-{max(cpus):.2f}], "
              f"round trips x{median(trips):.2f} [{min(trips):.2f}-{max(trips):.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
