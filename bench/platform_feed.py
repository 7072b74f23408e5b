"""Platform feed cost (issue 23): central's own CPU per platform event through
CentralService.handle_platform_batch (one instance) on Azurite, for the two cases the feed brings:

  redelivered  Event Grid's at-least-once: every event a redelivery of one already recorded (dropped by its
               Event Grid id), the steady case to compare with a steady signed envelope (0.23-0.28 ms)
  transitions  every event a new status of a known event (Scheduled -> Started -> Completed): a State
               commit, alerts owed, decisions; compare with central_throughput's `events` scenario
  signed       in the same run and process, central_throughput's `steady-authn` scenario (signed envelopes
               that change no event, --signed-batches of 100): the steady figure the goal names (0.23-0.28 ms)
  signed-transitions
               in the same run and process, the same transitions reported by the VMs instead: signed
               envelopes, each a new incarnation moving one event (Scheduled -> Started, then gone, which is
               how IMDS shows the end), the like-for-like peer of `transitions`
So the goal, no more CPU than a signed envelope, is checked both ways, each ratio taken in the same run:
redelivered / signed (steady vs steady) and transitions / signed-transitions (a status change vs the same
status change).

    python -m bench.platform_feed [--events 600] [--runs 3] [--signed-batches 10]

As in central_throughput, central's logger is set to ERROR: with no webhook configured every alert would
otherwise be printed (two lines per transition), which is not what central does with a webhook.

Each scenario runs --runs times (a fresh table prefix each); figures are the median [min-max]. Every body is
made before the clock starts. Bounded: a fixed number of events; Azurite is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any, Dict, List

from bench import Figure, record, spread_figure
from bench.central_throughput import FakeVm
from bench.central_throughput import run as run_envelopes
from central.runtime.service import CentralService
from sandbox import processes

REPEATS_INSIDE = True
EMITTED = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
T0 = datetime.now(timezone.utc).replace(microsecond=0)
BATCH = 100


def grid(event_id: str, vm: str, status: str) -> bytes:
    nb = format_datetime(T0 + timedelta(hours=2), usegmt=True) if status == "Scheduled" else ""
    rid = (f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/{vm}"
           f"/providers/Microsoft.Maintenance/scheduledevents/{event_id}")
    return json.dumps([{
        "id": str(uuid.uuid4()), "topic": "/subscriptions/s", "subject": rid, "eventType": EMITTED,
        "dataVersion": "3.0", "metadataVersion": "1", "eventTime": T0.isoformat(),
        "data": {"resourceInfo": {"id": rid, "name": event_id, "properties": {
            "EventId": event_id, "EventType": "Freeze", "EventStatus": status, "Resources": [vm],
            "NotBefore": nb, "EventSource": "Platform", "DurationInSeconds": 5, "Description": "bench"}}},
    }]).encode()


def run(svc: CentralService, events: int, label: str) -> Dict[str, float]:
    ids = [f"B-{uuid.uuid4()}" for _ in range(events)]
    scheduled = [grid(e, f"bench_{i % 300}", "Scheduled") for i, e in enumerate(ids)]
    for start in range(0, len(scheduled), BATCH):  # every event recorded first, untimed
        svc.handle_platform_batch(scheduled[start:start + BATCH], now=T0)
    timed = scheduled if label == "redelivered" else [
        grid(e, f"bench_{i % 300}", s) for s in ("Started", "Completed") for i, e in enumerate(ids)]
    cpu_before, started = time.process_time(), time.perf_counter()
    processed = duplicates = 0
    for start in range(0, len(timed), BATCH):
        result = svc.handle_platform_batch(timed[start:start + BATCH], now=T0 + timedelta(seconds=1))
        processed, duplicates = processed + result.processed, duplicates + result.duplicates
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    figures = {"events": len(timed), "cpu_ms_per_event": round(1000 * cpu / len(timed), 3),
               "events_per_s": round(len(timed) / elapsed), "processed": processed, "duplicates": duplicates}
    print(f"{label:12s} {len(timed):6d} platform events in {elapsed:6.2f} s = "
          f"{figures['events_per_s']:6d}/s; "
          f"central CPU {figures['cpu_ms_per_event']:.3f} ms per event "
          f"(processed {processed}, duplicates {duplicates})", flush=True)
    return figures


def _incarnation(vm: FakeVm, events: List[Dict[str, Any]], diff: Dict[str, Any], at: datetime) -> bytes:
    vm.incarnation += 1
    doc = {"DocumentIncarnation": vm.incarnation, "Events": events}
    data = {"vm": vm.identity(), "incarnation": vm.incarnation, "previousIncarnation": vm.incarnation - 1,
            "reset": False, "apiVersion": "2020-07-01", "document": doc, "diff": diff,
            "observedAt": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    return vm._wrap("incarnation", f"{vm.vm_id}:incarnation:{vm.incarnation}", data, at)


def run_signed_transitions(svc: CentralService, signer: Any, vm_count: int = 300) -> Dict[str, float]:
    """Each VM's event moved by signed envelopes: Scheduled (untimed), then Started and gone (timed)."""
    vms = [FakeVm(i) for i in range(vm_count)]
    at = T0 + timedelta(seconds=1)
    stages: List[List[bytes]] = [[vm.heartbeat(at) for vm in vms], [], [], []]
    for vm in vms:
        event = {"EventId": str(uuid.uuid4()).upper(), "EventStatus": "Scheduled", "EventType": "Freeze",
                 "ResourceType": "VirtualMachine", "Resources": [vm.name],
                 "NotBefore": format_datetime(T0 + timedelta(hours=2), usegmt=True), "Description": "bench",
                 "EventSource": "Platform", "DurationInSeconds": 5}
        started = {**event, "EventStatus": "Started", "NotBefore": ""}
        stages[1].append(_incarnation(vm, [event], {"new": [event], "changed": [], "gone": []}, at))
        stages[2].append(_incarnation(vm, [started], {"new": [], "changed": [started], "gone": []}, at))
        stages[3].append(_incarnation(vm, [], {"new": [], "changed": [], "gone": [started]}, at))
    names = {vm.vm_id: vm.name for vm in vms}

    def signed(bodies: List[bytes]) -> List[Any]:
        return [signer.properties(names[json.loads(b)["partitionkey"]], json.loads(b)["partitionkey"], b)
                for b in bodies]

    planned = [[(part, signed(part)) for part in (stage[i:i + BATCH] for i in range(0, len(stage), BATCH))]
               for stage in stages]
    for stage in planned[:2]:  # every VM known and its event recorded first, untimed
        for bodies, props in stage:
            svc.handle_batch(bodies, now=at, properties=props)
    cpu_before, started_at = time.process_time(), time.perf_counter()
    processed = 0
    for stage in planned[2:]:
        for bodies, props in stage:
            processed += svc.handle_batch(bodies, now=at + timedelta(seconds=1), properties=props).processed
    elapsed, cpu = time.perf_counter() - started_at, time.process_time() - cpu_before
    assert svc.sender_auth.refused == 0, "signed envelopes were refused: the figure would measure refusals"
    figures = {"events": processed, "cpu_ms_per_event": round(1000 * cpu / max(1, processed), 3)}
    print(f"signed-transitions {processed:6d} signed envelopes in {elapsed:6.2f} s; central CPU "
          f"{figures['cpu_ms_per_event']:.3f} ms per envelope (each moves one event)", flush=True)
    return figures


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=600)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--signed-batches", type=int, default=10)
    args = parser.parse_args(argv)
    logging.getLogger("central").setLevel(logging.ERROR)  # no webhook here: do not print each alert
    # No ARM here: the agentless bench VMs' approvals fail for want of a token, which pauses ARM calls
    # for 60 s after the first (as on Azure without the role); their error lines are not the figure.
    for name in ("central.act", "azure.identity"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    from sandbox.imds.signer import Signer

    signer = Signer()
    azurite = processes.start_azurite()
    runs: Dict[str, List[Dict[str, Any]]] = {"redelivered": [], "transitions": [], "signed": [],
                                             "signed-transitions": []}
    try:
        conn = azurite.extra["connection_string"]
        for _ in range(max(1, args.runs)):
            for name in ("redelivered", "transitions"):
                svc = CentralService.from_settings({"ApprovalStorage": conn,
                                                    "TABLE_PREFIX": "pf" + uuid.uuid4().hex[:10]})
                runs[name].append(run(svc, args.events, name))
            svc = CentralService.from_settings({"ApprovalStorage": conn, "AUTHN_TRUST_PEM": signer.trust_pem,
                                                "TABLE_PREFIX": "pfs" + uuid.uuid4().hex[:10]},
                                               count_requests=True)
            got = run_envelopes(svc, [FakeVm(i) for i in range(300)], max(1, args.signed_batches), 0,
                                "signed", signer)
            assert got["refused"] == 0, "signed envelopes were refused: the figure would measure refusals"
            runs["signed"].append({"cpu_ms_per_event": got["cpu_ms_per_envelope"]})
            svc = CentralService.from_settings({"ApprovalStorage": conn, "AUTHN_TRUST_PEM": signer.trust_pem,
                                                "TABLE_PREFIX": "pft" + uuid.uuid4().hex[:10]})
            runs["signed-transitions"].append(run_signed_transitions(svc, signer))
    finally:
        azurite.stop()
    figures = []
    labels = {"signed": "central CPU per signed envelope (steady), same run",
              "signed-transitions": "central CPU per signed envelope moving an event, same run"}
    for name, goal in (("redelivered", "<= 0.28"), ("transitions", ""), ("signed", ""),
                       ("signed-transitions", "")):
        values = [r["cpu_ms_per_event"] for r in runs[name]]
        what = "signed envelope" if name in labels else "platform event"
        print(f"{name}: central CPU per {what} {statistics.median(values):.3f} ms "
              f"[{min(values):.3f}-{max(values):.3f}] over {len(values)} runs", flush=True)
        label = labels.get(name, f"central CPU per platform event ({name})")
        figures.append(spread_figure(Figure("platform_feed", label, 0.0, "ms", goal), values))
    for mine, peer, what, goal in (
            ("redelivered", "signed", "steady platform event / steady signed envelope", "<= 1"),
            ("transitions", "signed-transitions",
             "platform transition / signed envelope with the same transition", "<= 1"),
            ("transitions", "signed",
             "platform transition / steady signed envelope (not like for like)", "")):
        ratios = [m["cpu_ms_per_event"] / p["cpu_ms_per_event"] for m, p in zip(runs[mine], runs[peer])]
        print(f"{what}, per run: {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
              + (f" (goal: {goal})" if goal else ""), flush=True)
        figure = Figure("platform_feed", f"{what} CPU, same run", 0.0, "x", goal)
        figures.append(spread_figure(figure, ratios))
    record(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
