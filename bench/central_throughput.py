"""Central throughput: envelopes/s through CentralService.handle_batch (one instance) on Azurite, central's
own CPU per envelope (this process's CPU time: parsing, validation, planning, the SDK's serialisation;
Azurite runs in another process), and Storage round trips (HTTP requests, counted in the azure-core
transport) per 100-envelope batch and per decision.

    python -m bench.central_throughput [--batches 30] [--vms 300]

Goals: >= 1,000 envelopes/s per instance; <= 0.5 ms central CPU per envelope; <= 3 Storage round trips
per steady-state batch. Scenarios (each after warm-up batches that create the tables and every VM row):
  steady   heartbeats and incarnations that change no event (the common case)
  events   every incarnation brings a new event: decisions, approvals (queue), alerts
Bounded: a fixed number of batches, and Azurite is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any, Dict, List

from bench import Figure, record
from central.service import CentralService
from sandbox import processes

T0 = datetime.now(timezone.utc).replace(microsecond=0)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeVm:
    """Builds schema-valid envelopes the way a forwarder would (central never imports the forwarder)."""

    def __init__(self, index: int) -> None:
        self.name = f"bench_{index}"
        self.vm_id = str(uuid.uuid4())
        self.incarnation = 0
        self.beats = 0

    def identity(self) -> Dict[str, Any]:
        return {
            "vmId": self.vm_id,
            "name": self.name,
            "vmScaleSetName": "bench",
            "resourceId": f"/subscriptions/0/resourceGroups/rg/providers/Microsoft.Compute/vm/{self.name}",
            "tags": {"role": "bench"},
        }

    def _wrap(self, kind: str, id_: str, data: Dict[str, Any], at: datetime) -> bytes:
        return json.dumps(
            {
                "specversion": "1.0",
                "id": id_,
                "source": self.identity()["resourceId"],
                "type": f"scheduledevents.{kind}.v1",
                "subject": self.name,
                "time": iso(at),
                "datacontenttype": "application/json",
                "partitionkey": self.vm_id,
                "data": data,
            }
        ).encode()

    def heartbeat(self, at: datetime) -> bytes:
        self.beats += 1
        data = {
            "vm": self.identity(),
            "forwarder": {"version": "bench", "startedAt": iso(T0)},
            "lastIncarnation": self.incarnation,
            "scheduledEventIds": [],
            "outbox": {"backlog": 0, "dropped": 0, "lastSendAt": iso(at), "lastError": None},
        }
        return self._wrap("heartbeat", f"{self.vm_id}:heartbeat:{self.beats}", data, at)

    def incarnation_env(self, at: datetime, with_event: bool) -> bytes:
        self.incarnation += 1
        events: List[Dict[str, Any]] = []
        if with_event:
            events = [
                {
                    "EventId": str(uuid.uuid4()).upper(),
                    "EventStatus": "Scheduled",
                    "EventType": "Reboot",
                    "ResourceType": "VirtualMachine",
                    "Resources": [self.name],
                    "NotBefore": format_datetime(at + timedelta(minutes=15), usegmt=True),
                    "Description": "bench",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            ]
        doc = {"DocumentIncarnation": self.incarnation, "Events": events}
        digest = hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]
        data = {
            "vm": self.identity(),
            "incarnation": self.incarnation,
            "previousIncarnation": self.incarnation - 1 or None,
            "reset": False,
            "apiVersion": "2020-07-01",
            "document": doc,
            "diff": {"new": events, "changed": [], "gone": []},
            "observedAt": iso(at),
        }
        return self._wrap("incarnation", f"{self.vm_id}:incarnation:{self.incarnation}:{digest}", data, at)


def batch(vms: List[FakeVm], start: int, at: datetime, events_every: int) -> List[bytes]:
    """100 envelopes from 100 different VMs: 2 of 3 heartbeats, 1 of 3 incarnations."""
    out = []
    for i in range(100):
        vm = vms[(start + i) % len(vms)]
        if i % 3 == 2:
            out.append(vm.incarnation_env(at, with_event=events_every > 0 and i % events_every == 2))
        else:
            out.append(vm.heartbeat(at))
    return out


def run(
    svc: CentralService, vms: List[FakeVm], batches: int, events_every: int, label: str
) -> Dict[str, float]:
    assert svc.transport is not None
    at = T0
    warm = (len(vms) + 99) // 100
    for n in range(warm):  # warm-up: tables, every VM's row (a later batch finds them cached)
        svc.handle_batch(batch(vms, n * 100, at, 0), now=at)
    requests_before = svc.transport.requests
    envelopes = 0
    approvals = 0
    decisions = 0
    cpu_before = time.process_time()
    started = time.perf_counter()
    for n in range(batches):
        at = at + timedelta(seconds=1)
        bodies = batch(vms, (n + warm) * 100, at, events_every)
        result = svc.handle_batch(bodies, now=at)
        envelopes += result.processed
        approvals += result.approvals_sent
        decisions += len(result.decisions)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    trips = (svc.transport.requests - requests_before) / batches
    figures = {
        "envelopes": envelopes,
        "seconds": round(elapsed, 3),
        "envelopes_per_s": round(envelopes / elapsed),
        "cpu_ms_per_envelope": round(1000 * cpu / max(1, envelopes), 3),
        "round_trips_per_100": round(trips, 2),
        "approvals": approvals,
        "decisions": decisions,
    }
    print(
        f"{label:8s} {envelopes:6d} envelopes in {elapsed:6.2f} s = "
        f"{figures['envelopes_per_s']:6d} envelopes/s; central CPU {figures['cpu_ms_per_envelope']:.3f} ms "
        f"per envelope; Storage round trips per 100-envelope batch: {trips:.2f}"
        + (f" (decisions: {decisions}, approvals sent: {approvals})" if approvals else ""),
        flush=True,
    )
    return figures


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--vms", type=int, default=300)
    args = parser.parse_args(argv)
    logging.getLogger("central").setLevel(logging.ERROR)  # no webhook here: do not print each alert
    azurite = processes.start_azurite()
    try:
        conn = azurite.extra["connection_string"]
        print(
            f"central throughput: {args.batches} batches of 100 envelopes per scenario, {args.vms} VMs, "
            f"Azurite (in memory) on loopback",
            flush=True,
        )
        steady = CentralService.from_settings(
            {"ApprovalStorage": conn, "TABLE_PREFIX": "benchsteady"}, count_requests=True
        )
        figures = {"steady": run(steady, [FakeVm(i) for i in range(args.vms)], args.batches, 0, "steady")}
        busy = CentralService.from_settings(
            {"ApprovalStorage": conn, "TABLE_PREFIX": "benchevents"}, count_requests=True
        )
        figures["events"] = run(busy, [FakeVm(i) for i in range(args.vms)], args.batches, 33, "events")
        s, e = figures["steady"], figures["events"]
        per_decision = (
            (e["round_trips_per_100"] - s["round_trips_per_100"]) * args.batches / max(1, e["decisions"])
        )
        figures["round_trips_per_decision"] = round(per_decision, 2)
        print(f"Storage round trips per decision (events minus steady, per decision): {per_decision:.2f}")
        goal_rate = s["envelopes_per_s"] >= 1000
        goal_cpu = s["cpu_ms_per_envelope"] <= 0.5
        goal_trips = s["round_trips_per_100"] <= 3
        print(
            f"goals: >= 1,000 envelopes/s: {'met' if goal_rate else 'NOT met'}; "
            f"<= 0.5 ms CPU per envelope: {'met' if goal_cpu else 'NOT met'}; "
            f"<= 3 round trips per steady batch: {'met' if goal_trips else 'NOT met'}"
        )
        print(json.dumps(figures))
        record(
            [
                Figure(
                    "central_throughput",
                    "steady envelopes/s",
                    s["envelopes_per_s"],
                    "1/s",
                    ">= 1000",
                    goal_rate,
                ),
                Figure(
                    "central_throughput",
                    "steady central CPU per envelope",
                    s["cpu_ms_per_envelope"],
                    "ms",
                    "<= 0.5",
                    goal_cpu,
                ),
                Figure(
                    "central_throughput",
                    "steady round trips per 100",
                    s["round_trips_per_100"],
                    "requests",
                    "<= 3",
                    goal_trips,
                ),
                Figure(
                    "central_throughput",
                    "round trips per decision",
                    figures["round_trips_per_decision"],
                    "requests",
                ),
                Figure("central_throughput", "with new events envelopes/s", e["envelopes_per_s"], "1/s"),
                Figure(
                    "central_throughput",
                    "with new events round trips per 100",
                    e["round_trips_per_100"],
                    "requests",
                ),
            ]
        )
    finally:
        azurite.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
