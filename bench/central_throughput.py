"""Central throughput: envelopes/s through CentralService.handle_batch (one instance) on Azurite, and
Storage round trips (HTTP requests, counted in the azure-core transport) per 100-envelope batch.

    python -m bench.central_throughput [--batches 30] [--vms 200]

Goals: >= 1,000 envelopes/s per instance; <= 2 Storage round trips per steady-state batch.
Scenarios (each after one warm-up batch that creates tables and loads state):
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
    svc.handle_batch(batch(vms, 0, at, 0), now=at)  # warm-up: tables, state load, first VM rows
    requests_before = svc.transport.requests
    envelopes = 0
    approvals = 0
    started = time.perf_counter()
    for n in range(batches):
        at = at + timedelta(seconds=1)
        bodies = batch(vms, (n + 1) * 100, at, events_every)
        result = svc.handle_batch(bodies, now=at)
        envelopes += result.processed
        approvals += result.approvals_sent
    elapsed = time.perf_counter() - started
    trips = (svc.transport.requests - requests_before) / batches
    figures = {
        "envelopes": envelopes,
        "seconds": round(elapsed, 3),
        "envelopes_per_s": round(envelopes / elapsed),
        "round_trips_per_100": round(trips, 2),
        "approvals": approvals,
    }
    print(
        f"{label:8s} {envelopes:6d} envelopes in {elapsed:6.2f} s = "
        f"{figures['envelopes_per_s']:6d} envelopes/s; "
        f"Storage round trips per 100-envelope batch: {trips:.2f}"
        + (f" (approvals sent: {approvals})" if approvals else ""),
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
        goal_rate = figures["steady"]["envelopes_per_s"] >= 1000
        goal_trips = figures["steady"]["round_trips_per_100"] <= 2
        print(
            f"goals: >= 1,000 envelopes/s: {'met' if goal_rate else 'NOT met'}; "
            f"<= 2 round trips per steady batch: {'met' if goal_trips else 'NOT met'}"
        )
        print(json.dumps(figures))
        s, e = figures["steady"], figures["events"]
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
                    "steady round trips per 100",
                    s["round_trips_per_100"],
                    "requests",
                    "<= 2",
                    goal_trips,
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
