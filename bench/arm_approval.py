"""Approvals through ARM, whole (issue 23): how soon an ARM approval reaches the fabric.

    python -m bench.arm_approval [--events 10]

Runs a sandbox fleet of agentless VMs (no forwarders): the IMDS simulator publishes Azure's own feed into the
platform hub and serves ARM's acknowledge API; central (the Functions runner with function_app.py) reads the
platform hub, its policy approves every event, and it acknowledges through ARM at the stand-in, with a
managed-identity token from the simulator. Time scale 1.

For each of N Reboots, spaced by a random 0.5-1.5 s, round robin over the VMs:
- decision -> fabric approval: central's committed decision (its Decisions row, `At`) to the instant the
  simulator started the event (`startedAt`), both on this machine's wall clock. Goal: median <= 3 s, the
  loop goal of a queue approval;
- event in the fabric -> fabric approval: the whole loop through Azure's side (the feed's delivery, central's
  platform trigger, the decision, the ARM call), to compare with bench.approval_loop's queue path.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from bench import Figure, median, record
from sandbox.demo.fleet import Fleet, FleetSettings, VmSpec
from sandbox.demo.scenario import table_rows

VMS = tuple(VmSpec(f"vm-x{i}", {"role": "batch"}, forwarder=False) for i in range(3))
POLICY = {"version": 1, "rules": [{"name": "approve-all", "match": {}, "action": "approve"}]}


def _epoch(value: object) -> Optional[float]:
    if isinstance(value, datetime):
        return value.timestamp()
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def measure(fleet: Fleet, events: int) -> Tuple[List[float], List[float]]:
    assert fleet.imds is not None
    names = [vm.name for vm in VMS]
    ids: List[str] = []
    deadline = time.monotonic() + 30 + events * 6
    for i in range(events):
        event = fleet.imds.add_event(eventType="Reboot", resources=[names[i % len(names)]], startedSeconds=5)
        ids.append(event["eventId"])
        time.sleep(random.uniform(0.5, 1.5))
    started: Dict[str, float] = {}
    created: Dict[str, float] = {}
    while time.monotonic() < deadline and len(started) < len(ids):
        for event_id in ids:
            if event_id in started:
                continue
            sim = fleet.imds.event(event_id)
            at = _epoch(sim.get("startedAt"))
            if at is not None and sim.get("approvedBy"):
                started[event_id], created[event_id] = at, float(_epoch(sim["createdAt"]) or 0.0)
        time.sleep(0.3)
    decided: Dict[str, float] = {}
    for row in table_rows(fleet.storage, ["Decisions"])["Decisions"]:
        if row.get("EventId") in started and row.get("Action") == "approve" and \
                str(row.get("LeaderVmName", "")).startswith("arm:"):
            decided.setdefault(row["EventId"], float(_epoch(row["At"]) or 0.0))
    loop = [started[e] - created[e] for e in ids if e in started]
    after_decision = [started[e] - decided[e] for e in ids if e in started and e in decided]
    missing = [e[:8] for e in ids if e not in started]
    if missing:
        print(f"  not approved through ARM within the bound: {', '.join(missing)}", flush=True)
    return after_decision, loop


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arm_approval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-arm-") as tmp:
        settings = FleetSettings(work=Path(tmp) / "fleet", vms=VMS, time_scale=1.0, policy=dict(POLICY),
                                 platform_feed=True, arm=True, central_instances=1)
        with Fleet(settings) as fleet:
            fleet.wait_until_central_knows_every_vm()
            after_decision, loop = measure(fleet, args.events)
    figures = []
    if after_decision:
        figures.append(Figure("arm_approval", "central's decision -> fabric approval (ARM) median",
                              round(median(after_decision), 3), "s", "<= 3"))
    if loop:
        figures.append(Figure("arm_approval", "event in the fabric -> fabric approval (feed + ARM) median",
                              round(median(loop), 3), "s"))
    figures.append(Figure("arm_approval", "events approved through ARM", len(after_decision), "events",
                          str(args.events), len(after_decision) == args.events))
    for f in figures:
        print(f"  {f.name}: {f.value} {f.unit}" + (f" (goal {f.goal})" if f.goal else ""), flush=True)
    record(figures)
    return 0 if len(after_decision) == args.events else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
