"""A maintenance wave on a large fleet, simulated in virtual time through central's own code.

    python -m bench.wave_sim [--vms 100000] [--events 10000] [--minutes 10] [--budget 10] [--instances 4]
                             [--compare-one]

Four CentralService instances (`--instances`; `--compare-one` plays the same seeded wave with one instance at
the same time, in a process of its own (bench.side_by_side; on Azurite, after it), and prints the ratio per
1,000 envelopes of CPU inside central's calls and of Storage round trips, issue 24 item 4) (the real
central.runtime / central.store code: ingest, decide, act, the Tables and Queue clients of the azure SDKs),
each owning one of 4 Event Hubs partitions, against a Table/Queue service for the semantics (ETags,
conditional writes, `$batch`, approval queues): bench.table_memory, an in-memory stand-in the SDKs reach
through their own transport (checked against Azurite by tests/bench/test_table_memory.py; requests'
per-request preparation skipped unless `--http requests`: bench.table_memory_net.DirectSession), or Azurite
(`--store azurite`). bench.table_model gives Azure's pace: every Storage request is charged a modelled latency
(and throttling) on the calling instance's virtual clock. A call's virtual duration = its modelled Storage
time + the CPU time it used (thread CPU: other processes on the machine do not lengthen it). Batches form as
host.json says (up to maxEventBatchSize, waiting at most maxWaitTime for minEventBatchSize); the minute timer
runs on instance 0.

The fleet: `--vms` VMs in scale sets of 500; `--events` of them get a Reboot over `--minutes`
(uniform first reports); a budget per scale set (`maxImpacted`). Each VM's approval queue exists before
the wave, as the forwarder's install leaves it (`--queues missing`: central creates it with its first
send, two more requests). Each VM acts as the forwarder would:
reads its approval within 2 s, posts it, reports the result (+0.7 s publish), Started 5 s later and
the event gone 180 s after that. A VM with an event open heartbeats every 60 s (the forwarder's default)
from its first report until the event is gone: its liveness is what lets central elect it leader. An event
still unapproved at its NotBefore (first report + 15 min) is started by Azure: Started then, gone 180 s
later. Not played: the heartbeats of the 90 % of the fleet without an event (they never touch the head
row or an event; bench.fleet_cost prices them).

Measured: first report -> first decision (any verdict) and -> approval, p50 / p99; approvals per
event (goal: never 2); the most VMs of a scale set approved-and-not-ended at once against the budget
(from the approval's send to the VM's report that the event is gone; also printed counting each until
the call that took that report ended, which can overlap an approval by a call that started later but
ended sooner: calls are played one at a time, each seeing every earlier-started call's commits);
commits that lost a race; Storage requests and throttled ones; real seconds taken.
`--validate` adds the same 1,000-VM scenario three times: on the stand-in and on Azurite, both charged
the model (the stand-in against the reference), and on Azurite charged its own measured latencies
(the model against a real service's pace); it prints all. Each run also reports its process CPU
seconds: on a shared machine real seconds say more about the neighbours than about the run.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
import tempfile
import time
import zlib
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from bench import Figure, record, side_by_side, table_memory_net
from bench.central_throughput import FakeVm
from bench.fleet_units import wave_incarnation
from bench.table_memory import MemoryStorage
from bench.table_model import Model, ModelTransport
from bench.wave_report import Outcome, compare, report, summarize
from forwarder.envelope import hub_partition_key
from sandbox import processes

REPEATS_INSIDE = True  # `python -m bench` runs it once (bounded: 420 s + 3 x 50 s): seeded, virtual time
PARTITIONS = 4  # each owned by one instance (partition p: instance p % --instances)
SCALE_SET_SIZE = 500
TIMER_EVERY = 60.0
HEARTBEAT_EVERY = 60.0  # the forwarder's default
NOT_BEFORE_AFTER = 15 * 60.0  # bench.fleet_units.event_doc: NotBefore = first report + 15 min
REBOOT_SECONDS = 180.0  # Started -> the event gone
HEARTBEAT, AZURE_STARTS = "heartbeat", "azure-starts"  # entries rendered when due (or dropped)
APPROVALS = ("approve", "approve-after-hook", "approve-in-window")
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
HOST_JSON = Path(__file__).resolve().parent.parent / "host.json"
HOST = json.loads(HOST_JSON.read_text())["extensions"]["eventHubs"]


def _seconds(timespan: str) -> float:
    h, m, s = timespan.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


BATCH_MAX = int(HOST.get("maxEventBatchSize", 100))
BATCH_MIN = int(HOST.get("minEventBatchSize", 1))
MAX_WAIT = _seconds(HOST.get("maxWaitTime", "00:00:00")) if BATCH_MIN > 1 else 0.0


class SimVm(FakeVm):
    def __init__(self, index: int, route: str = "scale-set") -> None:
        super().__init__(index)
        self.scale_set = f"ss{index // SCALE_SET_SIZE}"
        # the Event Hubs partition key: the forwarder's (its scale set), or its vmId (`--route vm`: before)
        key = hub_partition_key({"data": {"vm": self.identity()}}) if route == "scale-set" else self.vm_id
        self.partition = zlib.crc32(key.encode()) % PARTITIONS

    def result(self, event_id: str, message_id: str, at: datetime) -> bytes:
        data = {"vm": self.identity(), "eventId": event_id, "messageId": message_id, "outcome": "approved",
                "reason": "sim", "decidedBy": "policy", "hook": None, "at": at.isoformat()}
        return self._wrap("approvalresult", f"{self.vm_id}:result:{event_id}:{message_id}", data, at)


def build(settings: Dict[str, str], model: Model, storage: Optional[MemoryStorage],
          http: str = "direct") -> Tuple[Any, ModelTransport]:
    from central.runtime.approval_queue import ApprovalSender
    from central.runtime.service import CentralService
    from central.runtime.settings import CentralSettings, storage_clients
    from central.runtime.webhook import WebhookAlerter
    from central.store.tables import TableLog

    typed = CentralSettings.from_mapping(settings)
    session = table_memory_net.session if http == "requests" else table_memory_net.direct_session
    transport = ModelTransport(model, **({"session": session(storage)} if storage else {}))
    tables, queues = storage_clients(settings, transport=transport)
    alerter = WebhookAlerter(url="", fmt="generic", max_attempts=1, backoff=0.0, timeout=1.0)
    return CentralService(typed, TableLog(tables, typed.table_prefix), ApprovalSender(queues), alerter,
                          transport), transport


def simulate(args: argparse.Namespace, connection: str, model: Model, tag: str,
             storage: Optional[MemoryStorage] = None) -> Dict[str, float]:
    """One run against `connection` (Azurite's), or against `storage` (the in-memory stand-in)."""
    policy = {"version": 1, "budgets": {"scaleSet": {"groupBy": "scaleSet", "maxImpacted": args.budget}},
              "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}]}
    settings = {"ApprovalStorage": connection, "TABLE_PREFIX": f"wave{tag}",
                "POLICY_JSON": json.dumps(policy), "ALERT_WEBHOOK_URL": ""}
    instances = args.instances
    services = [build(settings, model, storage, args.http) for _ in range(instances)]
    rng = random.Random(24)
    vms = [SimVm(i, getattr(args, "route", "scale-set")) for i in range(args.vms)]
    out = Outcome()
    arrivals: List[List[Tuple[float, int, Optional[bytes], str]]] = [[] for _ in range(PARTITIONS)]  # heaps
    seq = [0]
    last: Dict[str, dict] = {}
    owner: Dict[str, SimVm] = {}

    def arrive(vm: SimVm, at: float, body: Optional[bytes], kind: str = "") -> None:
        seq[0] += 1
        heapq.heappush(arrivals[vm.partition], (at, seq[0], body, kind))

    def starts(vm: SimVm, event_id: str, started: float) -> None:
        """The event starts at `started` (after the VM's approval, or Azure's at NotBefore): Started,
        then gone (the end of its impact)."""
        out.started.add(event_id)
        arrive(vm, started, wave_incarnation(vm, event_id, "Started", T0 + timedelta(seconds=started), last))
        gone = started + REBOOT_SECONDS
        ended = wave_incarnation(vm, event_id, "", T0 + timedelta(seconds=gone), last)
        arrive(vm, gone, ended, kind=event_id)

    def due(entry: Tuple[float, int, Optional[bytes], str]) -> Optional[bytes]:
        """A lazy entry's body now (None: dropped): a heartbeat while the event is open (and the next
        one queued), Azure's start at NotBefore unless the VM started it already."""
        at, _, body, kind = entry
        if body is not None:
            return body
        what, event_id = kind.split(":", 1)
        vm = owner[event_id]
        if event_id in out.ended:  # its gone report was delivered: the VM has nothing more to say
            return None
        if what == HEARTBEAT:
            arrive(vm, at + HEARTBEAT_EVERY, None, kind)
            return vm.heartbeat(T0 + timedelta(seconds=at))
        if event_id not in out.started:  # AZURE_STARTS: nobody approved it in time
            starts(vm, event_id, at)
        return None

    span = args.minutes * 60.0
    for vm in rng.sample(vms, args.events):
        at = rng.uniform(0.0, span)
        event_id = f"E-{vm.vm_id[:8]}".upper()
        if event_id in owner:  # two vmIds sharing 8 hex digits (~1 % of 10,000-event waves): one EventId each
            event_id = f"E-{vm.vm_id[:13]}".upper()
        owner[event_id], out.scale_set[event_id], out.first_report[event_id] = vm, vm.scale_set, at
        arrive(vm, at, wave_incarnation(vm, event_id, "Scheduled", T0 + timedelta(seconds=at), last))
        arrive(vm, at + rng.uniform(0.0, HEARTBEAT_EVERY), None, f"{HEARTBEAT}:{event_id}")
        arrive(vm, at + NOT_BEFORE_AFTER, None, f"{AZURE_STARTS}:{event_id}")
    if args.queues == "installed":
        install_queues([owner[e].vm_id for e in owner], connection, storage)
    free = [0.0] * instances  # when each instance is done with its current call (one call at a time)
    clock: List[Tuple[float, int, str, int]] = [(0.0, p, "wake", p) for p in range(PARTITIONS)]
    clock.append((TIMER_EVERY, 99, "timer", 0))
    heapq.heapify(clock)
    horizon = span + args.drain_minutes * 60.0

    def call(i: int, t: float, fn: Any) -> float:
        svc, transport = services[i]
        transport.now, transport.io = t, 0.0
        cpu, real, requests = time.thread_time(), time.monotonic(), transport.requests
        answering = storage.cpu if storage is not None else 0.0
        decisions = fn(svc)
        if args.verbose:
            print(f"  call {out.calls} instance {i} at {t:.1f}: {time.monotonic() - real:.2f} s real, "
                  f"{transport.requests - requests} requests, {len(decisions)} decisions", flush=True)
        # the in-memory stand-in answers on this thread: its CPU is the service's (charged by the model)
        used = time.thread_time() - cpu - ((storage.cpu - answering) if storage is not None else 0.0)
        duration = used + transport.io
        free[i] = t + duration
        out.calls += 1
        out.invocation_cpu += used
        for d in decisions:
            if args.verbose:
                print(f"    {d.event_id} {d.action} state={d.state} msg={d.message_id} by={d.decided_by} "
                      f"reason={d.reason[:90]}", flush=True)
            out.first_decision.setdefault(d.event_id, free[i])
            if d.action in APPROVALS and d.message_id:  # an approval sent (not one waiting for budget)
                out.approved.setdefault(d.event_id, []).append(free[i])
                vm = owner[d.event_id]
                read = free[i] + rng.uniform(0.0, 2.0)  # the VM's fast queue reads, every 2 s
                if d.event_id in out.started:  # (never: approved twice, or after Azure started it)
                    continue
                result = vm.result(d.event_id, d.message_id or "", T0 + timedelta(seconds=read))
                arrive(vm, read + 0.7, result)
                starts(vm, d.event_id, read + 5.0)
        return duration

    deadline = time.monotonic() + args.max_real_seconds
    cpu_started = time.process_time()
    while clock:
        t, order, kind, p = heapq.heappop(clock)  # p: the partition (the timer's: instance 0)
        if t > horizon or len(out.ended) == args.events:
            break
        if time.monotonic() > deadline:  # bounded: report what was simulated, and say so
            out.cut_at = t
            break
        i = p % instances  # the instance that owns the partition
        if t < free[i]:
            heapq.heappush(clock, (free[i], order, kind, p))
            continue
        if kind == "timer":
            call(i, t, lambda s, now=T0 + timedelta(seconds=t): s.reevaluate(now=now))
            heapq.heappush(clock, (t + TIMER_EVERY, 99, "timer", 0))
            continue
        queue = arrivals[p]
        ready = [a for a in queue if a[0] <= t]
        if not ready:
            if queue:
                heapq.heappush(clock, (queue[0][0], p, "wake", p))
            else:
                heapq.heappush(clock, (t + 1.0, p, "wake", p))  # results may still come
            continue
        ready.sort()
        if len(ready) < BATCH_MIN and ready[0][0] + MAX_WAIT > t:  # (the same sum as the wake's)
            heapq.heappush(clock, (ready[0][0] + MAX_WAIT, p, "wake", p))
            continue
        popped = [heapq.heappop(queue) for _ in range(min(BATCH_MAX, len(ready)))]
        batch = [(a, body) for a in popped for body in (due(a),) if body is not None]
        gone = [a for a, _ in batch if a[3] and ":" not in a[3]]  # kind = the EventId: its gone report
        for a in gone:  # the event's end (its VM stops heartbeating)
            out.ended[a[3]] = a[0]
        if not batch:  # only dropped entries: look again
            heapq.heappush(clock, (t, p, "wake", p))
            continue
        out.envelopes += len(batch)
        stamps = [T0 + timedelta(seconds=a[0]) for a, _ in batch]
        bodies, now = [body for _, body in batch], T0 + timedelta(seconds=t)
        call(i, t, lambda s, b=bodies, n=now, e=stamps: s.handle_batch(b, now=n, enqueued_times=e).decisions)
        for a in gone:
            out.processed[a[3]] = free[i]
        heapq.heappush(clock, (free[i], p, "wake", p))
    out.cpu = time.process_time() - cpu_started
    out.store_cpu = storage.cpu if storage is not None else float("nan")
    return summarize(out, args, services, model)


def install_queues(vm_ids: List[str], connection: str, storage: Optional[MemoryStorage]) -> None:
    """The VMs' approval queues, as the forwarder's install leaves them (infra/forwarder/queue-access.bicep
    creates each VM's queue, to scope its role to it): central's first send to a VM is then one request."""
    from central.runtime.approval_queue import queue_name

    names = [queue_name(v) for v in vm_ids]
    if storage is not None:
        for name in names:
            storage.queues.setdefault(name, 0)
        return
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.queue import QueueServiceClient

    service = QueueServiceClient.from_connection_string(connection)
    for name in names:
        try:
            service.create_queue(name)
        except ResourceExistsError:
            pass


def parser() -> argparse.ArgumentParser:
    """The wave's options and their defaults (bench.wave_overhead plays the same wave)."""
    parser = argparse.ArgumentParser(prog="python -m bench.wave_sim", description=__doc__.split("\n")[0])
    parser.add_argument("--vms", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--budget", type=int, default=10, help="maxImpacted per scale set of 500 VMs")
    parser.add_argument("--instances", type=int, choices=range(1, PARTITIONS + 1), default=4,
                        help=f"central instances sharing the {PARTITIONS} partitions")
    parser.add_argument("--compare-one", action="store_true",
                        help="play the main wave with 1 instance too, at the same time on the stand-in "
                             "(a second core), and print the ratio per 1,000 envelopes (issue 24 item 4)")
    parser.add_argument("--drain-minutes", type=float, default=30.0,
                        help="virtual time after the last report")
    parser.add_argument("--verbose", action="store_true", help="a line per call")
    parser.add_argument("--max-real-seconds", type=float, default=420.0,
                        help="stop the main run after this long (figures cover the virtual time reached)")
    parser.add_argument("--validate-seconds", type=float, default=50.0,
                        help="the same bound for each 1,000-VM validation run")
    parser.add_argument("--validate", action=argparse.BooleanOptionalAction, default=True,
                        help="also 1,000 VMs / 100 events twice: the model's latencies vs Azurite's own")
    parser.add_argument("--route", choices=("vm", "scale-set"), default="scale-set",
                        help="each VM's Event Hubs partition: by its scale set, as the forwarder sends it "
                             "(forwarder.envelope.hub_partition_key), or by its vmId (the forwarder before)")
    parser.add_argument("--store", choices=("memory", "azurite"), default="memory",
                        help="the main run's Table/Queue service: the in-memory stand-in or Azurite")
    parser.add_argument("--http", choices=("direct", "requests"), default="direct",
                        help="how the SDKs reach the in-memory stand-in: requests' session with its "
                             "per-request preparation skipped (direct), or the whole of it (requests)")
    parser.add_argument("--queues", choices=("installed", "missing"), default="installed",
                        help="the VMs' approval queues exist before the wave, as the forwarder's install "
                             "creates them (installed), or central creates each with its first send "
                             "(missing; on Azurite a queue an earlier run created is kept)")
    return parser


def play(args: argparse.Namespace, model: Model, tag: str,
         connection: str = "") -> Tuple[Dict[str, float], float]:
    """One run, and its real seconds: on Azurite at `connection`, or on a new in-memory stand-in ('')."""
    started = time.monotonic()
    if connection:
        result = simulate(args, connection, model, tag)
    else:
        result = simulate(args, table_memory_net.connection_string(), model, tag, MemoryStorage())
    return result, time.monotonic() - started


def play_on_memory(args: argparse.Namespace, tag: str) -> Tuple[Dict[str, float], float]:
    """`play` on the stand-in with the Azure model (what `--compare-one` plays side by side)."""
    return play(args, Model(), tag)


def main(argv: List[str]) -> int:
    args = parser().parse_args(argv)
    figures: List[Figure] = []
    small = argparse.Namespace(**{**vars(args), "vms": 1000, "events": 100,
                                  "max_real_seconds": args.validate_seconds})
    main_label = f"{args.vms} VMs, {args.events} events" + (", Azurite" if args.store == "azurite" else "")
    one = argparse.Namespace(**{**vars(args), "instances": 1})
    compare_one = args.compare_one and args.instances > 1
    runs: List[Tuple[str, argparse.Namespace, Model, str]] = []
    if compare_one and args.store == "memory":
        # the 1-instance wave at the same time, in a process of its own: the machine's drift cancels out
        (many, many_s), (single, single_s) = side_by_side.run(
            lambda: play_on_memory(args, "r0"), play_on_memory, one, "r1")
        figures += report(main_label, many, many_s, args.budget)
        figures += report(main_label + ", 1 instance", single, single_s, args.budget)
        figures += compare(main_label, many, single, args.instances, "side by side")
    else:
        runs.append((main_label, args, Model(), args.store))
        if compare_one:  # on Azurite: one after the other (one Azurite)
            runs.append((main_label + ", 1 instance", one, Model(), args.store))
    if args.validate:  # the same 1k scenario on the stand-in and on Azurite; then Azurite's own pace
        runs += [("1000 VMs, 100 events, stand-in, Azure model", small, Model(), "memory"),
                 ("1000 VMs, 100 events, Azurite, Azure model", small, Model(), "azurite"),
                 ("1000 VMs, 100 events, Azurite latencies", small, Model(use_measured=True), "azurite")]
    results: List[Dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        azurite = processes.start_azurite(log_dir=Path(tmp)) if any(r[3] == "azurite" for r in runs) else None
        try:
            for n, (label, run_args, model, store) in enumerate(runs):
                connection = azurite.extra["connection_string"] if store == "azurite" and azurite else ""
                result, real_s = play(run_args, model, f"r{n}", connection)
                figures += report(label, result, real_s, run_args.budget)
                results.append(result)
                if label == main_label + ", 1 instance":
                    figures += compare(main_label, results[0], result, args.instances, "one after the other")
        finally:
            if azurite is not None:
                azurite.stop()
    record(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
