"""Counting what Azure would bill for, from one real run of the sandbox pipeline (bench.fleet_cost's
measuring half): the real function_app.py in the sandbox Functions runner (the repo's host.json),
the sandbox Event Hubs server, Azurite behind counting proxies (State/log tables and approval queues;
AzureWebJobsStorage blobs, where the trigger checkpoints and owns partitions).

One run at fleet size N: every VM's first heartbeat (warm-up, not counted: central learns the fleet),
then one heartbeat per VM published at the fleet's real rate (N per heartbeat interval, paced so the
trigger's batches are the size they would be), then a maintenance wave (a share of the VMs each get an
event: Scheduled, Started, gone; paced too). Per phase it counts envelopes and bytes, ingest
executions and their durations, Storage requests per service, and the runner's log lines by category
and level. Counts do not depend on CPU load; durations (GB-s) do.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Dict, List, Tuple

from azure.eventhub import EventHubProducerClient

from bench import runner_log
from bench.central_throughput import FakeVm
from bench.fleet_traffic import HUB, PARTITIONS, SIGNER, send_signed
from sandbox import processes
from tests.functions.conftest import RunnerFiles, start_runner

LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<name>[\w.]+): (?P<msg>.*)$")
EXECUTED = re.compile(r"^Executed 'Functions\.(\w+)' \((\w+), Id=[^,]+, Duration=(\d+)ms\)")
CPU = re.compile(r"^Execution CPU 'Functions\.(\w+)' \(Id=[^,]+, Cpu=(\d+)us\)")


@dataclass
class Phase:
    """What one measured phase made Azure bill for (raw counts)."""

    envelopes: int = 0
    bytes: int = 0
    seconds: float = 0.0
    executions: Dict[str, int] = field(default_factory=dict)  # function -> count
    exec_ms: Dict[str, int] = field(default_factory=dict)  # function -> summed Duration
    cpu_us: Dict[str, int] = field(default_factory=dict)  # function -> summed thread CPU of its executions
    table: int = 0
    queue: int = 0
    blob: int = 0
    # (category, level) -> [lines, message bytes]; category: host-function | host | user | heartbeat-marker
    logs: Dict[Tuple[str, str], List[int]] = field(default_factory=dict)


@dataclass
class Run:
    vms: int
    steady: Phase
    wave: Phase
    wave_events: int
    idle_seconds: float
    idle_table: int
    idle_blob: int
    mention_bytes: float  # message bytes per VM named in a `se.heartbeat` line (lines name many VMs)


def event_doc(vm: FakeVm, event_id: str, status: str, at: datetime) -> Dict[str, object]:
    return {
        "EventId": event_id, "EventStatus": status, "EventType": "Reboot",
        "ResourceType": "VirtualMachine", "Resources": [vm.name],
        "NotBefore": format_datetime(at + timedelta(minutes=15), usegmt=True) if status == "Scheduled"
        else "",
        "Description": "bench", "EventSource": "Platform", "DurationInSeconds": -1,
    }


def wave_incarnation(vm: FakeVm, event_id: str, status: str, at: datetime, last: Dict[str, dict]) -> bytes:
    """A new incarnation of `vm` in which its event is `status` ('' = gone); `last` keeps the event as
    the VM last reported it (the diff's before / gone)."""
    vm.incarnation += 1
    before = last.get(vm.vm_id)
    event = event_doc(vm, event_id, status, at) if status else None
    diff = {"new": [event] if event and before is None else [],
            "changed": [{"before": before, "after": event}] if event and before else [],
            "gone": [before] if event is None and before else []}
    if event is not None:
        last[vm.vm_id] = event
    doc = {"DocumentIncarnation": vm.incarnation, "Events": [event] if event else []}
    data = {
        "vm": vm.identity(), "incarnation": vm.incarnation, "previousIncarnation": vm.incarnation - 1,
        "reset": False, "apiVersion": "2020-07-01", "document": doc, "diff": diff,
        "observedAt": at.isoformat().replace("+00:00", "Z"),
    }
    envelope_id = f"{vm.vm_id}:incarnation:{vm.incarnation}:{uuid.uuid4().hex[:8]}"
    return vm._wrap("incarnation", envelope_id, data, at)


class Pacer:
    """Publishes bodies at a given rate, grouped per partition (partition = crc32(vmId) % 4, as the hub
    hashes keys), one producer for the whole run; each body signed by its VM."""

    def __init__(self, conn: str) -> None:
        self.producer = EventHubProducerClient.from_connection_string(conn)

    def close(self) -> None:
        self.producer.close()

    def send(self, bodies: List[bytes]) -> None:
        """Signed by each body's VM and grouped per partition, as forwarders publish."""
        send_signed(self.producer, bodies)

    def paced(self, bodies: List[bytes], seconds: float, tick: float = 0.25) -> None:
        """`bodies` spread evenly over `seconds` (bounded: one send per tick)."""
        ticks = max(1, int(seconds / tick))
        start = time.monotonic()
        for i in range(ticks):
            part = bodies[len(bodies) * i // ticks: len(bodies) * (i + 1) // ticks]
            if part:
                self.send(part)
            delay = start + (i + 1) * tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def _classify(name: str, msg: str) -> str:
    if name == "sandbox.functions":
        host_function = msg.startswith(("Executing 'Functions.", "Executed 'Functions."))
        return "host-function" if host_function else "host"
    return "heartbeat-marker" if msg.startswith("se.heartbeat ") else "user"


class Meter:
    """Reads the runner's log and the proxies' counters from a mark on."""

    def __init__(self, log: Path, tables: object, queues: object, blobs: object) -> None:
        self.log, self.tables, self.queues, self.blobs = log, tables, queues, blobs
        self.offset, self.counts, self.t0 = 0, (0, 0, 0), 0.0

    def _counts(self) -> Tuple[int, int, int]:
        return tuple(sum(p.counts.values()) for p in (self.tables, self.queues, self.blobs))  # type: ignore

    def mark(self) -> None:
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        self.counts, self.t0 = self._counts(), time.monotonic()

    def text(self) -> str:
        with self.log.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode("utf-8", errors="replace")

    def ingested(self) -> int:
        return runner_log.ingested(self.text())

    def wait(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.ingested() < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"central processed {self.ingested()} of {n} envelopes in {timeout:.0f} s")
            time.sleep(0.25)

    def phase(self, envelopes: int, nbytes: int) -> Phase:
        p = Phase(envelopes=envelopes, bytes=nbytes, seconds=time.monotonic() - self.t0)
        now = self._counts()
        p.table, p.queue, p.blob = (now[i] - self.counts[i] for i in range(3))
        for line in self.text().splitlines():
            m = LINE.match(line)
            if not m:
                continue
            name, level, msg = m.group("name"), m.group("level"), m.group("msg")
            slot = p.logs.setdefault((_classify(name, msg), level), [0, 0])
            slot[0] += 1
            slot[1] += len(msg.encode())
            done = EXECUTED.match(msg)
            if done:
                fn = done.group(1)
                p.executions[fn] = p.executions.get(fn, 0) + 1
                p.exec_ms[fn] = p.exec_ms.get(fn, 0) + int(done.group(3))
            spent = CPU.match(msg)
            if spent:
                p.cpu_us[spent.group(1)] = p.cpu_us.get(spent.group(1), 0) + int(spent.group(2))
        return p


def measure(n: int, work: Path, azurite: processes.Server, interval: float, wave_share: float,
            wave_seconds: float, idle_seconds: float, timeout: float) -> Run:
    from bench.approval_loop import CountingProxy

    ports = azurite.ports
    hub = processes.start_eventhubs([f"{HUB}={PARTITIONS}", f"{processes.PLATFORM_HUB}=1"],
                                   log_dir=work / f"eh{n}")
    tables, queues = CountingProxy(ports["table"]).start(), CountingProxy(ports["queue"]).start()
    blobs = CountingProxy(ports["blob"]).start()
    runner = None
    try:
        files = RunnerFiles(work / f"cost{n}")
        files.write({
            "AzureWebJobsStorage":
                processes.azurite_connection_string(blobs.port, ports["queue"], ports["table"]),
            "ApprovalStorage": processes.azurite_connection_string(ports["blob"], queues.port, tables.port),
            **processes.central_hub_settings(hub.port, HUB),
            "EVENTHUB_CONSUMER_GROUP": "central", "TABLE_PREFIX": f"cost{n}",
            "AUTHN_TRUST_PEM": SIGNER.trust_pem,  # central in its default AUTHN_MODE=required: VMs sign
            "POLICY_JSON": "", "ALERT_WEBHOOK_URL": "", "ALERT_WEBHOOK_FORMAT": "generic",
            "REEVALUATE_SCHEDULE": "0 */1 * * * *",  # infra's default (main.bicep reevaluateSchedule)
        })
        runner = start_runner(files, "function_app")
        meter = Meter(files.directory / "functions.log", tables, queues, blobs)
        pacer = Pacer(processes.eventhubs_connection_string(hub.port, HUB))
        try:
            vms = [FakeVm(i) for i in range(n)]
            now = datetime.now(timezone.utc)
            meter.mark()
            pacer.send([vm.heartbeat(now) for vm in vms])  # warm-up: central learns the fleet
            meter.wait(n, timeout)
            time.sleep(2.0)
            meter.mark()  # idle: the host's own background (ownership renewals), no envelopes
            time.sleep(idle_seconds)
            idle = meter.phase(0, 0)
            beats = [vm.heartbeat(datetime.now(timezone.utc)) for vm in vms]
            meter.mark()
            pacer.paced(beats, interval)
            meter.wait(n, timeout)
            steady = meter.phase(len(beats), sum(len(b) for b in beats))
            marker = [ln.split(": ", 1)[1] for ln in files.directory.joinpath("functions.log").read_text(
                errors="replace").splitlines() if ": se.heartbeat " in ln]
            mentions = sum(m.count(" vmId=") for m in marker)
            wave_vms = vms[: max(1, int(n * wave_share))]
            ids = {vm.vm_id: str(uuid.uuid4()).upper() for vm in wave_vms}
            last: Dict[str, dict] = {}
            meter.mark()
            sent, nbytes = 0, 0
            for status in ("Scheduled", "Started", ""):
                at = datetime.now(timezone.utc)
                bodies = [wave_incarnation(vm, ids[vm.vm_id], status, at, last) for vm in wave_vms]
                pacer.paced(bodies, wave_seconds / 3)
                sent, nbytes = sent + len(bodies), nbytes + sum(len(b) for b in bodies)
                meter.wait(sent, timeout)
            wave = meter.phase(sent, nbytes)
        finally:
            pacer.close()
    finally:
        if runner is not None:
            runner.stop()
        hub.stop()
        for proxy in (tables, queues, blobs):
            proxy.stop()
    return Run(n, steady, wave, len(wave_vms), idle.seconds, idle.table, idle.blob,
               sum(len(m.encode()) for m in marker) / max(1, mentions))
