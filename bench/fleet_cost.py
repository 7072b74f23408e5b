"""What a fleet makes Azure bill: billable units per VM-hour counted from real runs of the sandbox
pipeline (bench.fleet_units), priced at list prices (bench.azure_prices) for 1k, 10k and 100k VMs.

    python -m bench.fleet_cost [--sizes 1000,10000] [--interval 60] [--events-per-vm-month 4]

Counted per run (method in docs/sizing.md): Event Hubs ingress events and bytes; ingest executions and
their active time, priced as GB-s at the instance memory infra/main.bicep deploys. Flex Consumption on
demand bills the instance memory while an instance is executing (learn.microsoft.com/azure/ azure-
functions/functions-consumption-costs, Flex Consumption billing modes), which on Azure is the
execution's CPU plus its waits on Storage: the executions' own thread CPU is measured (the runner logs
it; other load on this shared machine barely moves it, unlike wall time) and each counted Table/Queue
request adds bench.table_model's mean Azure latency (~8.4 ms, assumed). The wall-clock durations timed
here (Azurite on a loaded machine) are priced beside it for comparison; Table, Queue and Blob requests
(counting proxies: the State/log tables, the approval queues, the trigger's checkpoint and ownership
blobs); the log records Application Insights would receive under the repo's host.json (the host's
request per execution and Executing/Executed traces, central's own lines by level, the host's aggregated
per-function metrics, central's OpenTelemetry metrics). Modelled, and said so in the output: the VMs'
own queue reads per event, one approval-result envelope per event (priced as one incarnation), heartbeat
markers per VM-hour (central names each VM once per 450 s, half the heartbeats-missing alert's default
15 minutes, the VMs of a batch in one line; the played
heartbeats span less time), Capture's files. The heartbeat interval is a parameter: units per heartbeat
are measured at the fleet's rate for the sizes played; the largest played size stands in for larger
fleets (its batches are smaller than theirs would be, so executions per envelope are over-, not under-
counted).

Counts are not timings: other processes loading the CPU do not change them; wall-clock durations do,
which is why they are not what GB-s is priced from.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from bench import Figure, record
from bench.azure_prices import (
    HOURS_PER_MONTH,
    METRIC_RECORD_BYTES,
    PRICES,
    REQUEST_RECORD_BYTES,
    TRACE_RECORD_BYTES,
)
from bench.fleet_traffic import PARTITIONS
from bench.fleet_units import Run, measure
from bench.table_model import MEDIAN_S, SIGMA
from central.intake.plan import HEARTBEAT_LOG_EVERY
from central.telemetry.metrics import HEARTBEATS_PER_LINE
from forwarder.config import BY_KEY
from sandbox import processes

REPO = Path(__file__).resolve().parent.parent
LEVELS = {"trace": 0, "debug": 1, "information": 2, "warning": 3, "error": 4, "critical": 5, "none": 6}
PY_LEVELS = {"DEBUG": 1, "INFO": 2, "WARNING": 3, "ERROR": 4, "CRITICAL": 5}
IDLE_CLOSE = float(BY_KEY["eventhub_idle_close"].default)  # the forwarder's default, seconds
CONNECTIONS_PER_NAMESPACE = 5000  # Event Hubs Standard: brokered connections per namespace
AGGREGATOR_ROWS = 7  # Host.Aggregator: Count, Successes, Failures, SuccessRate, Min/Max/AvgDuration per flush
AGGREGATOR_FLUSHES_PER_HOUR = 120  # its default flush timeout, 30 s
CAPTURE_BLOCK = 4 * 1024 * 1024  # Capture's blob block (assumed 4 MiB per Put Block)
STORAGE_MEAN_S = MEDIAN_S * math.exp(SIGMA ** 2 / 2)  # the mean of bench.table_model's lognormal, ~8.4 ms


def host_levels(path: Path = REPO / "host.json") -> Dict[str, int]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    levels = raw.get("logging", {}).get("logLevel", {})
    return {k.lower(): LEVELS[str(v).lower()] for k, v in levels.items()}


def level_of(levels: Dict[str, int], category: str) -> int:
    """The host's rule: the longest configured prefix of the category, else `default` (Information)."""
    parts = category.lower().split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in levels:
            return levels[key]
    return levels.get("default", 2)


def instance_memory_gb(path: Path = REPO / "infra" / "main.bicep") -> float:
    found = re.search(r"param functionInstanceMemoryMB int = (\d+)", path.read_text(encoding="utf-8"))
    if not found:
        raise RuntimeError("infra/main.bicep: functionInstanceMemoryMB default not found")
    return int(found.group(1)) / 1024.0


def log_bytes(phase_logs: Dict, executions: int, levels: Dict[str, int]) -> Dict[str, float]:
    """Records and billed bytes Application Insights would get for a phase's lines (markers excluded)."""
    out = {"records": 0.0, "bytes": 0.0}
    passes = {
        "host-function": level_of(levels, "Function.ingest"),
        "user": level_of(levels, "Function.ingest.User"),
    }
    for (category, level), (lines, nbytes) in phase_logs.items():
        if category not in passes or PY_LEVELS.get(level, 2) < passes[category]:
            continue  # "host": the sandbox runner's own lines, not the real host's; markers: modelled
        out["records"] += lines
        out["bytes"] += lines * TRACE_RECORD_BYTES + nbytes
    if level_of(levels, "Host.Results") <= 2:
        out["records"] += executions
        out["bytes"] += executions * REQUEST_RECORD_BYTES
    return out


def units_per_vm_hour(run: Run, args: argparse.Namespace, levels: Dict[str, int]) -> Dict[str, float]:
    """Per VM-hour: heartbeats at args.interval plus args.events_per_vm_month events."""
    s, w = run.steady, run.wave
    beats = 3600.0 / args.interval
    events = args.events_per_vm_month / HOURS_PER_MONTH
    per_event = 4.0 / 3.0 / max(1, run.wave_events)  # 3 incarnations played + 1 result assumed alike
    idle_t = run.idle_table / max(run.idle_seconds, 1e-9)
    idle_b = run.idle_blob / max(run.idle_seconds, 1e-9)

    def steady_rate(value: float, idle_rate: float = 0.0) -> float:
        return max(0.0, value - idle_rate * s.seconds) / s.envelopes * beats

    def wave_rate(value: float, idle_rate: float = 0.0) -> float:
        return max(0.0, value - idle_rate * w.seconds) * per_event * events

    s_exec, w_exec = s.executions.get("ingest", 0), w.executions.get("ingest", 0)
    table = steady_rate(s.table, idle_t) + wave_rate(w.table, idle_t)
    queue = steady_rate(s.queue) + wave_rate(w.queue)
    s_logs, w_logs = log_bytes(s.logs, s_exec, levels), log_bytes(w.logs, w_exec, levels)
    # `se.heartbeat`: each VM named once per HEARTBEAT_LOG_EVERY; a line names the VMs of one batch
    # (at most 100): a record per line, the measured bytes per VM named
    markers = 3600.0 / max(HEARTBEAT_LOG_EVERY, args.interval)
    per_line = min(float(HEARTBEATS_PER_LINE), s.envelopes / max(1, s_exec))
    marker_on = level_of(levels, "Function.ingest.User") <= 2
    vm_reads = args.fast_minutes * 60.0 / args.fast_interval + 2  # reads while Scheduled; receive, delete
    return {
        "eh_events": beats + 4 * events,
        "eh_bytes": s.bytes / s.envelopes * beats + w.bytes / max(1, w.envelopes) * 4 * events,
        "executions": steady_rate(s_exec) + wave_rate(w_exec),
        # billed active time (module docstring): the executions' own CPU + their Storage round trips
        # at Azure's mean latency; the wall-clock durations timed here are kept for comparison
        "exec_seconds": steady_rate(s.cpu_us.get("ingest", 0) / 1e6)
        + wave_rate(w.cpu_us.get("ingest", 0) / 1e6) + (table + queue) * STORAGE_MEAN_S,
        "exec_seconds_wall": steady_rate(s.exec_ms.get("ingest", 0) / 1000.0)
        + wave_rate(w.exec_ms.get("ingest", 0) / 1000.0),
        "table": table,
        "queue_central": queue,
        "queue_vm": vm_reads * events,
        "blob": steady_rate(s.blob, idle_b) + wave_rate(w.blob, idle_b),
        "log_records": steady_rate(s_logs["records"]) + wave_rate(w_logs["records"])
        + (markers / per_line if marker_on else 0.0),
        "log_bytes": steady_rate(s_logs["bytes"]) + wave_rate(w_logs["bytes"])
        + ((TRACE_RECORD_BYTES / per_line + run.mention_bytes) * markers if marker_on else 0.0),
    }


def fixed_per_hour(run: Run, instances: int, levels: Dict[str, int], timer_s: float) -> Dict[str, float]:
    """What the deployment bills with no VM at all: the timer, the trigger's ownership renewals, the
    host's aggregated metrics and central's metric export per instance."""
    aggregator = AGGREGATOR_ROWS * 2 * AGGREGATOR_FLUSHES_PER_HOUR
    if level_of(levels, "Host.Aggregator") > 2:
        aggregator = 0
    metric_rows = (aggregator + 60 * 2) * instances  # + OpenTelemetry: ~2 series exported per minute
    return {
        "executions": 60.0, "exec_seconds": 60.0 * timer_s,
        "table": run.idle_table / max(run.idle_seconds, 1e-9) * 3600,
        "blob": run.idle_blob / max(run.idle_seconds, 1e-9) * 3600,
        "log_records": metric_rows + (60.0 if level_of(levels, "Host.Results") <= 2 else 0.0),
        "log_bytes": metric_rows * METRIC_RECORD_BYTES
        + (60.0 * REQUEST_RECORD_BYTES if level_of(levels, "Host.Results") <= 2 else 0.0),
    }


def namespaces(n: int, interval: float) -> int:
    """Standard namespaces n forwarders need for their AMQP connections (5,000 each, docs/sizing.md): a
    forwarder holds one from a send until eventhub_idle_close seconds later (+1 s to reconnect)."""
    held = min(1.0, (IDLE_CLOSE + 1.0) / interval) if IDLE_CLOSE else 1.0
    return max(1, math.ceil(n * held / CONNECTIONS_PER_NAMESPACE))


def bill(n: int, per_vm: Dict[str, float], run: Run, levels: Dict[str, int], mem_gb: float,
         timer_s: float, capture: bool, interval: float = 60.0) -> Dict[str, float]:
    """USD per month for n VMs, one line per meter. Each namespace bills at least one TU."""
    events_s = n * per_vm["eh_events"] / 3600.0
    bytes_s = n * per_vm["eh_bytes"] / 3600.0
    spaces = namespaces(n, interval)
    tus = max(spaces, math.ceil(events_s / 1000.0), math.ceil(bytes_s / 1e6))
    busy = n * per_vm["exec_seconds"] / 3600.0
    instances = max(1, min(PARTITIONS * 8, math.ceil(busy / 0.5)))
    fixed = fixed_per_hour(run, instances, levels, timer_s)
    month = {k: (n * per_vm.get(k, 0.0) + fixed.get(k, 0.0)) * HOURS_PER_MONTH
             for k in ("eh_events", "executions", "exec_seconds", "table", "queue_central", "queue_vm",
                       "blob", "log_bytes")}
    p = {k: v.usd for k, v in PRICES.items()}
    lines = {
        "Event Hubs throughput units": tus * HOURS_PER_MONTH * p["eh_tu_hour"],
        "Event Hubs ingress events": month["eh_events"] / 1e6 * p["eh_ingress_million"],
        "Functions executions": month["executions"] / 1e6 * p["fx_million_exec"],
        "Functions GB-s": month["exec_seconds"] * mem_gb * p["fx_gb_s"],
        "Table transactions": month["table"] / 1e4 * p["table_10k"],
        "Queue operations (central + VMs)":
            (month["queue_central"] + month["queue_vm"]) / 1e4 * p["queue_10k"],
        "Blob operations (checkpoints, ownership)": month["blob"] / 1e4 * p["blob_10k"],
        "Log Analytics ingestion": month["log_bytes"] / 1e9 * p["la_gb"],
    }
    if capture:
        files = PARTITIONS * 3600.0 / 300.0 * HOURS_PER_MONTH  # one file per partition per 300 s window
        blocks = files + n * per_vm["eh_bytes"] * HOURS_PER_MONTH / CAPTURE_BLOCK
        lines["Capture (TU-hours)"] = tus * HOURS_PER_MONTH * p["eh_capture_tu_hour"]
        lines["Capture blob writes"] = (files + blocks) / 1e4 * p["blob_10k"]
    lines.update({"_tus": tus, "_namespaces": spaces, "_instances": instances, "_events_s": events_s,
                  "_bytes_s": bytes_s})
    wall = (n * per_vm["exec_seconds_wall"] + fixed["exec_seconds"]) * HOURS_PER_MONTH
    lines["_gbs_wall"] = wall * mem_gb * p["fx_gb_s"]  # as timed wall-clock here, for comparison
    lines["_log_gb"] = month["log_bytes"] / 1e9
    return lines


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000", help="fleet sizes played (paced at their real rate)")
    parser.add_argument("--price-sizes", default="1000,10000,100000", help="fleet sizes priced")
    parser.add_argument("--interval", type=float, default=60.0,
                        help="heartbeat interval, s (forwarder default 60)")
    parser.add_argument("--events-per-vm-month", type=float, default=4.0)
    parser.add_argument("--wave", type=float, default=0.05, help="share of the played VMs in the wave")
    parser.add_argument("--wave-seconds", type=float, default=30.0)
    parser.add_argument("--fast-minutes", type=float, default=15.0,
                        help="minutes a VM reads its queue at the fast interval per event (worst case)")
    parser.add_argument("--fast-interval", type=float, default=2.0)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    played = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    levels, mem_gb = host_levels(), instance_memory_gb()
    runs: Dict[int, Run] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        azurite = processes.start_azurite(log_dir=work)
        try:
            for n in played:
                runs[n] = measure(n, work, azurite, 60.0 if args.interval <= 0 else min(args.interval, 60.0),
                                  args.wave, args.wave_seconds, args.idle_seconds, args.timeout)
        finally:
            azurite.stop()
    figures: List[Figure] = []
    timer_s = 0.05  # the minute timer's execution, s (ASSUMED: played runs are too short to hold one)
    for n, run in runs.items():
        if run.steady.executions.get("reevaluate"):  # its CPU + the idle Table requests (its own)
            timer_s = (run.steady.cpu_us.get("reevaluate", 0) / 1e6 / run.steady.executions["reevaluate"]
                       + run.idle_table / max(run.idle_seconds, 1e-9) * 60.0 * STORAGE_MEAN_S)
        per_vm = units_per_vm_hour(run, args, levels)
        print(f"played {n} VMs: steady {run.steady.envelopes} heartbeats in {run.steady.seconds:.0f} s, "
              f"{run.steady.executions.get('ingest', 0)} executions; wave {run.wave_events} events "
              f"({run.wave.envelopes} incarnations), {run.wave.executions.get('ingest', 0)} executions")
        print("  per VM-hour: " + ", ".join(f"{k} {v:.4g}" for k, v in per_vm.items()))
        w, k = run.wave, max(1, run.wave_events)
        print(f"  wave, per event (3 incarnations): Table {w.table / k:.2f}, Queue {w.queue / k:.2f}, "
              f"executions {w.executions.get('ingest', 0) / k:.2f}")
        for key in ("executions", "exec_seconds", "exec_seconds_wall", "table", "queue_central", "blob",
                    "log_bytes"):
            figures.append(Figure("fleet_cost", f"played {n} VMs: {key} per VM-hour",
                                  round(per_vm[key], 5), ""))
    print(f"\nprices (USD; {len(PRICES)} meters, sources in bench/azure_prices.py and docs/sizing.md); "
          f"instance memory {mem_gb:g} GB (infra/main.bicep); heartbeat every {args.interval:g} s; "
          f"{args.events_per_vm_month:g} events per VM-month")
    for size in (int(s) for s in args.price_sizes.split(",") if s.strip()):
        run = runs[max([n for n in runs if n <= size] or [min(runs)])]
        per_vm = units_per_vm_hour(run, args, levels)
        for capture in (False, True):
            lines = bill(size, per_vm, run, levels, mem_gb, timer_s, capture, args.interval)
            total = sum(v for k, v in lines.items() if not k.startswith("_"))
            label = f"{size} VMs, Capture {'on' if capture else 'off'}"
            print(f"\n{label} (from the {run.vms}-VM run): {lines['_namespaces']:.0f} Standard "
                  f"namespace(s), {lines['_tus']:.0f} TU, "
                  f"{lines['_events_s']:.0f} events/s, {lines['_bytes_s'] / 1e6:.2f} MB/s, "
                  f"~{lines['_instances']:.0f} busy instance(s), {lines['_log_gb']:.1f} GB logs/month")
            for k, v in lines.items():
                if not k.startswith("_"):
                    print(f"  {k:<42} {v:>10.2f} USD/month")
            print(f"  {'total':<42} {total:>10.2f} USD/month = {total / size:.5f} USD per VM-month")
            wall_total = total - lines["Functions GB-s"] + lines["_gbs_wall"]
            print(f"  (GB-s from wall-clock durations timed on this machine instead: "
                  f"{lines['_gbs_wall']:.2f}; total {wall_total / size:.5f} USD per VM-month)")
            goal = "<= 0.01" if size == 10000 and not capture else ""
            figures.append(Figure("fleet_cost", f"{label}: USD per VM-month", round(total / size, 5), "USD",
                                  goal, (total / size <= 0.01) if goal else None))
            if not capture:
                figures.append(Figure("fleet_cost", f"{label}: USD per VM-month, GB-s as timed wall-clock",
                                      round(wall_total / size, 5), "USD"))
                figures.append(Figure("fleet_cost", f"{size} VMs: Log Analytics GB per month",
                                      round(lines["_log_gb"], 2), "GB"))
    record(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
