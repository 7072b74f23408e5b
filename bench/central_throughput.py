"""Central throughput: envelopes/s through CentralService.handle_batch (one instance) on Azurite, central's
own CPU per envelope (this process's CPU time: parsing, validation, planning, the SDK's serialisation;
Azurite runs in another process), and Storage round trips (HTTP requests, counted in the azure-core
transport) per 100-envelope batch and per decision.

    python -m bench.central_throughput [--batches 30] [--vms 300] [--runs 3]

Goals: >= 1,000 envelopes/s per instance; <= 0.5 ms central CPU per envelope; <= 3 Storage round trips
per steady-state batch; the goals hold with sender authentication on. Scenarios (each after warm-up
batches that create the tables and every VM row; every body, and its signature, made before the clock
starts, so only central's work is timed):
  steady         heartbeats and incarnations that change no event (the common case)
  steady-authn   the same, every envelope signed as the forwarder signs it (attested document on every
                 event) and verified by central (AUTHN_TRUST_PEM: the simulator's test PKI)
  events         every incarnation brings a new event: decisions, approvals (queue), alerts
Each scenario runs --runs times (a fresh table prefix each); the figures are the median [min-max].
Bounded: a fixed number of batches, and Azurite is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any, Dict, List, Optional, Tuple

from bench import Figure, record, spread_figure
from central.runtime.service import CentralService
from sandbox import processes
from sandbox.imds.signer import Signer

T0 = datetime.now(timezone.utc).replace(microsecond=0)

REPEATS_INSIDE = True  # --runs (default 3): its figures are medians with their range


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FakeVm:
    """Builds schema-valid envelopes the way a forwarder would (central never imports the forwarder)."""

    def __init__(self, index: int) -> None:
        self.name = f"bench_{index}"
        # 40 scale sets, VMs taken in turn: the forwarder's hub key (its scale set) spreads the heartbeats
        # over the partitions as they arrive, as a real fleet's many sets do (a set's VMs one after
        # another would fill one partition at a time: bigger batches than a fleet makes, a cost too low)
        self.scale_set = f"bench-{index % 40}"
        self.vm_id = str(uuid.uuid4())
        self.incarnation = 0
        self.beats = 0

    def identity(self) -> Dict[str, Any]:
        return {
            "vmId": self.vm_id,
            "name": self.name,
            "vmScaleSetName": self.scale_set,
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

    def scheduled_reboot(self, event_id: str, at: datetime, description: str) -> Dict[str, Any]:
        """A platform Reboot of this VM, Scheduled 15 minutes after `at`, as IMDS lists it."""
        return {
            "EventId": event_id,
            "EventStatus": "Scheduled",
            "EventType": "Reboot",
            "ResourceType": "VirtualMachine",
            "Resources": [self.name],
            "NotBefore": format_datetime(at + timedelta(minutes=15), usegmt=True),
            "Description": description,
            "EventSource": "Platform",
            "DurationInSeconds": -1,
        }

    def incarnation_env(self, at: datetime, with_event: bool) -> bytes:
        self.incarnation += 1
        events = [self.scheduled_reboot(str(uuid.uuid4()).upper(), at, "bench")] if with_event else []
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
    svc: CentralService, vms: List[FakeVm], batches: int, events_every: int, label: str,
    signer: Optional[Signer] = None,
) -> Dict[str, float]:
    assert svc.transport is not None
    at = T0
    warm = (len(vms) + 99) // 100
    planned = []  # (bodies, properties, time) of every batch, made before the clock starts
    for n in range(warm + batches):
        at = at + timedelta(seconds=1)
        bodies = batch(vms, n * 100, at, events_every if n >= warm else 0)
        props = None
        if signer is not None:
            names = {vm.vm_id: vm.name for vm in vms}
            ids = [json.loads(b)["partitionkey"] for b in bodies]
            props = [signer.properties(names[vm_id], vm_id, b) for vm_id, b in zip(ids, bodies)]
        planned.append((bodies, props, at))
    for bodies, props, at in planned[:warm]:  # warm-up: tables, every VM's row (later ones find them cached)
        svc.handle_batch(bodies, now=at, properties=props)
    requests_before = svc.transport.requests
    envelopes = approvals = decisions = 0
    cpu_before = time.process_time()
    started = time.perf_counter()
    for bodies, props, at in planned[warm:]:
        result = svc.handle_batch(bodies, now=at, properties=props)
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
        "refused": svc.sender_auth.refused,
    }
    print(
        f"{label:13s} {envelopes:6d} envelopes in {elapsed:6.2f} s = "
        f"{figures['envelopes_per_s']:6d} envelopes/s; central CPU {figures['cpu_ms_per_envelope']:.3f} ms "
        f"per envelope; Storage round trips per 100-envelope batch: {trips:.2f}"
        + (f" (decisions: {decisions}, approvals sent: {approvals})" if approvals else ""),
        flush=True,
    )
    return figures


def spread(values: List[float]) -> Tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def text(values: List[float], fmt: str = "{:.0f}") -> str:
    mid, low, high = spread(values)
    return f"{fmt.format(mid)} [{fmt.format(low)}-{fmt.format(high)}]"


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--vms", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    logging.getLogger("central").setLevel(logging.ERROR)  # no webhook here: do not print each alert
    signer = Signer()
    azurite = processes.start_azurite()
    try:
        conn = azurite.extra["connection_string"]
        print(
            f"central throughput: {args.runs} runs x {args.batches} batches of 100 envelopes per scenario, "
            f"{args.vms} VMs, Azurite (in memory) on loopback",
            flush=True,
        )
        scenarios = (("steady", 0, False), ("steady-authn", 0, True), ("events", 33, False))
        runs: Dict[str, List[Dict[str, float]]] = {name: [] for name, _, _ in scenarios}
        for n in range(args.runs):
            for name, every, authn in scenarios:
                settings = {"ApprovalStorage": conn, "TABLE_PREFIX": f"b{name.replace('-', '')}{n}"}
                if authn:
                    settings["AUTHN_TRUST_PEM"] = signer.trust_pem
                else:  # the unauthenticated baseline the authn scenario is compared with: explicit
                    settings["AUTHN_MODE"] = "off"
                svc = CentralService.from_settings(settings, count_requests=True)
                runs[name].append(run(svc, [FakeVm(i) for i in range(args.vms)], args.batches, every, name,
                                      signer if authn else None))

        def med(name: str, key: str) -> float:
            return statistics.median(r[key] for r in runs[name])

        def fig(figure_name: str, name: str, key: str, unit: str, goal: str = "",
                met: Optional[bool] = None) -> Figure:
            return spread_figure(Figure("central_throughput", figure_name, 0, unit, goal, met),
                                 [r[key] for r in runs[name]])

        per_decision = [
            (e["round_trips_per_100"] - s["round_trips_per_100"]) * args.batches / max(1, e["decisions"])
            for s, e in zip(runs["steady"], runs["events"])
        ]
        authn_cost = [a["cpu_ms_per_envelope"] - s["cpu_ms_per_envelope"]
                      for s, a in zip(runs["steady"], runs["steady-authn"])]
        print(f"\nmedians [min-max] of {args.runs} runs:")
        for name in runs:
            rate = text([r["envelopes_per_s"] for r in runs[name]])
            cpu = text([r["cpu_ms_per_envelope"] for r in runs[name]], "{:.3f}")
            trips = text([r["round_trips_per_100"] for r in runs[name]], "{:.2f}")
            print(f"  {name:13s} envelopes/s {rate}; CPU ms per envelope {cpu}; round trips per 100-envelope "
                  f"batch {trips}")
        ratio = med("steady-authn", "envelopes_per_s") / med("steady", "envelopes_per_s")
        print(f"  round trips per decision {text(per_decision, '{:.2f}')}; sender verification costs "
              f"{text(authn_cost, '{:.3f}')} ms of central CPU per envelope (steady-authn / steady rate: "
              f"{ratio:.2f})")
        refused = sum(r["refused"] for r in runs["steady-authn"])
        assert refused == 0, f"{refused} signed envelopes were refused: the benchmark measured refusals"
        goals = {}
        for name in ("steady", "steady-authn"):
            goals[name] = (med(name, "envelopes_per_s") >= 1000, med(name, "cpu_ms_per_envelope") <= 0.5,
                           med(name, "round_trips_per_100") <= 3)
            print(f"goals ({name}): >= 1,000 envelopes/s: {'met' if goals[name][0] else 'NOT met'}; "
                  f"<= 0.5 ms CPU per envelope: {'met' if goals[name][1] else 'NOT met'}; "
                  f"<= 3 round trips per steady batch: {'met' if goals[name][2] else 'NOT met'}")
        print(json.dumps(runs))
        record([
            fig("steady envelopes/s", "steady", "envelopes_per_s", "1/s", ">= 1000", goals["steady"][0]),
            fig("steady central CPU per envelope", "steady", "cpu_ms_per_envelope", "ms", "<= 0.5",
                goals["steady"][1]),
            fig("steady round trips per 100", "steady", "round_trips_per_100", "requests", "<= 3",
                goals["steady"][2]),
            fig("steady, authentication on: envelopes/s", "steady-authn", "envelopes_per_s", "1/s", ">= 1000",
                goals["steady-authn"][0]),
            fig("steady, authentication on: CPU per envelope", "steady-authn", "cpu_ms_per_envelope", "ms",
                "<= 0.5", goals["steady-authn"][1]),
            spread_figure(Figure("central_throughput", "sender verification CPU per envelope", 0, "ms"),
                          [round(v, 3) for v in authn_cost]),
            spread_figure(Figure("central_throughput", "round trips per decision", 0, "requests"),
                          [round(v, 2) for v in per_decision]),
            fig("with new events envelopes/s", "events", "envelopes_per_s", "1/s"),
            fig("with new events round trips per 100", "events", "round_trips_per_100", "requests"),
        ])
    finally:
        azurite.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
