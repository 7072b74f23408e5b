"""The approval loop, whole: event appears in IMDS -> StartRequests POST received by IMDS.

    python -m bench.approval_loop [--events 20] [--idle-seconds 125]

Runs the demo's fleet (sandbox/demo/fleet.py: Azurite, the Event Hubs server, the IMDS simulator with
3 VMs, 3 forwarder processes with the Event Hubs sink, the Functions runner with function_app.py) at
time scale 1 and the production pace: IMDS polled every 1 s, approval queue read every 2 s while the
VM has a Scheduled event and every 60 s otherwise.

1. Latency: N user Reboots (policy default: approve at once), round robin over the VMs, spaced by a
   random 0.5-1.5 s so they land at every phase of the polls. For each: the simulator's own clock
   both ends — the event's `createdAt` and the `t` of the POST in its request log. Goal: median
   <= 3 s, p99 <= 6 s.
2. Idle queue transactions per VM-hour: the forwarders reach Azurite's queue service through a
   counting HTTP proxy (sandbox/fault_proxy.py); with no event anywhere, every request they make in an idle
   window is counted and scaled to an hour. Goal 0: the forwarder reads only while an event is Scheduled.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional

from bench import Figure, median, percentile, record
from sandbox import processes
from sandbox.demo.fleet import FLEET, Fleet, FleetSettings
from sandbox.demo.scenario import posted_ids
from sandbox.fault_proxy import HttpProxy as CountingProxy


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def measure_latency(fleet: Fleet, events: int, started_seconds: float) -> List[float]:
    assert fleet.imds is not None
    names = [vm.name for vm in fleet.settings.vms]
    last: Dict[str, Optional[str]] = {n: None for n in names}
    ids: List[str] = []
    deadline = time.monotonic() + 30 + events * 8
    for i in range(events):
        vm = names[i % len(names)]
        previous = last[vm]
        while previous and time.monotonic() < deadline:  # one event per VM at a time
            if fleet.imds.event(previous)["state"] in ("Completed", "Cancelled"):
                break
            time.sleep(0.2)
        event = fleet.imds.add_event(eventType="Reboot", eventSource="User", resources=[vm],
                                     startedSeconds=started_seconds)
        ids.append(event["eventId"])
        last[vm] = event["eventId"]
        time.sleep(random.uniform(0.5, 1.5))
    while time.monotonic() < deadline:
        posted = {i for p in fleet.imds.requests(method="POST") for i in posted_ids(p)}
        if set(ids) <= posted:
            break
        time.sleep(0.5)
    posts: Dict[str, float] = {}
    for p in fleet.imds.requests(method="POST"):
        for event_id in posted_ids(p):
            posts.setdefault(event_id, float(p["t"]))
    latencies = []
    for event_id in ids:
        if event_id not in posts:
            print(f"  event {event_id[:8]}: no approval POST within the bound", flush=True)
            continue
        latencies.append(posts[event_id] - _epoch(fleet.imds.event(event_id)["createdAt"]))
    return latencies


def measure_idle(fleet: Fleet, proxy: CountingProxy, seconds: float) -> Dict[str, int]:
    """Queue requests per forwarder queue during `seconds` with nothing scheduled anywhere."""
    assert fleet.imds is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every event gone, every reader back to its slow pace
        if all(e["state"] in ("Completed", "Cancelled") for e in fleet.imds.events()):
            break
        time.sleep(0.5)
    time.sleep(fleet.settings.approval_fast_interval + fleet.settings.poll_interval + 1)
    start = time.time()
    time.sleep(seconds)
    end = time.time()
    per_queue: Counter = Counter()
    for entry in proxy.snapshot():
        if start <= entry["t"] < end and entry["queue"].startswith("vm-"):
            per_queue[entry["queue"]] += 1
    return dict(per_queue)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.approval_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--idle-seconds", type=float, default=125.0,
                        help="idle window (real seconds; the slow interval is 60 s, so >= 120 sees 2 reads)")
    args = parser.parse_args(argv)
    if args.events < 1 or args.idle_seconds <= 0:
        parser.error("--events >= 1 and --idle-seconds > 0")

    with tempfile.TemporaryDirectory(prefix="bench-approval-loop-") as tmp:
        settings = FleetSettings(work=Path(tmp) / "fleet", time_scale=1.0, heartbeat_interval=5.0)
        fleet = Fleet(settings)
        proxy: Optional[CountingProxy] = None
        try:
            # Azurite first, so the proxy knows its queue port; then the rest with the proxy in between.
            azurite = processes.start_azurite(log_dir=Path(tmp))
            try:
                proxy = CountingProxy(azurite.ports["queue"]).start()
            except BaseException:
                azurite.stop()
                raise
            settings.queue_port = proxy.port
            fleet.start(azurite)
            fleet.wait_until_central_knows_every_vm()
            print(f"fleet of {len(FLEET)} VMs up; {args.events} user Reboots at time scale 1, "
                  "IMDS poll 1 s, queue fast 2 s / slow 60 s", flush=True)
            latencies = measure_latency(fleet, args.events, started_seconds=2.0)
            print(f"idle window {args.idle_seconds:g} s ...", flush=True)
            idle = measure_idle(fleet, proxy, args.idle_seconds)
            seen = Counter(e["method"] for e in proxy.snapshot() if e["queue"].startswith("vm-"))
            print(f"queue requests through the proxy over the whole run, by method: {dict(seen)}")
        finally:
            fleet.stop()
            if proxy is not None:
                proxy.stop()

    figures: List[Figure] = []
    if latencies:
        med, p99 = median(latencies), percentile(latencies, 99)
        print(f"approval loop (IMDS event appears -> POST received), {len(latencies)}/{args.events} events: "
              f"median {med:.2f} s, p99 {p99:.2f} s, min {min(latencies):.2f} s, max {max(latencies):.2f} s")
        figures += [
            Figure("approval_loop", "event in IMDS -> approval POST median", round(med, 3), "s", "<= 3",
                   med <= 3),
            Figure("approval_loop", "event in IMDS -> approval POST p99", round(p99, 3), "s", "<= 6",
                   p99 <= 6),
        ]
    vms = len(FLEET)
    total = sum(idle.values())
    per_vm_hour = total / vms * 3600.0 / args.idle_seconds
    print(f"idle approval-queue requests: {total} from {vms} VMs in {args.idle_seconds:g} s "
          f"({sorted(idle.values())} per queue) = {per_vm_hour:.0f} per VM-hour")
    figures.append(Figure("approval_loop", "idle queue transactions per VM-hour", round(per_vm_hour, 1),
                          "tx/VM-h", "<= 0", per_vm_hour <= 0))
    figures.append(Figure("approval_loop", "approvals POSTed", len(latencies), "events", str(args.events),
                          len(latencies) == args.events))
    record(figures)
    return 0 if len(latencies) == args.events else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
