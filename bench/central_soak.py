"""Central soak (issue 50, item 2): the production function app (function_app.py, in the sandbox Functions
runner: real processes, as production runs several) under a steady fleet load for hours, sampled at fixed
intervals, so that whatever only grows is seen.

    python -m bench.central_soak [--hours 2] [--vms 1000] [--instances 2] [--hour-seconds 600]
    python -m bench.central_soak --report bench/results/central-soak.jsonl   # figures of a run so far

Load (published from this process to the sandbox Event Hubs server, each envelope signed as its VM's
forwarder signs it; central runs its default AUTHN_MODE=required and default policy):
  - heartbeats: every VM once per --heartbeat-seconds (60, the forwarder's default), spread evenly, in
    real time (central judges heartbeats, windows and leases on the real clock);
  - a maintenance wave each simulated hour (--hour-seconds of real time, 600 by default: six waves per
    real hour, six times the rate the issue asks, so a 2-hour run has 12): --wave of the VMs (5 %) get a
    new Scheduled Reboot at once (decisions, approvals to their queues), report it Started a sixth of the
    simulated hour later and gone (Completed) a third of it later. The clock itself is not sped up: a
    libfaketime speed-up of the runner would also speed the Event Hubs and Storage SDKs' timeouts, retries
    and AMQP token lifetimes (tools/faketime_site), so it would measure the stand-ins' behaviour under a
    clock they do not expect rather than central's.
Sampled every --sample-seconds, appended at once to --out (JSON lines; a run still going has usable data):
each runner process's RSS, CPU, threads and open fds, the CPU inside its invocations and the envelopes it
ingested (its log), the sizes of its service's in-memory caches (bench.soak_probe), the row counts of
every table (State by kind: VM rows, name rows, active and ended events, owed alerts; the log tables), the
head row's change-log length, and the stand-ins' RSS. At the end (or with --report) it prints per-hour
figures, writes a PNG plot and a markdown summary next to --out, and names every series that grew after
the first hour with the retention that bounds it (or why it must grow): RETENTION.
Bounded: a fixed duration; every server and runner is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import psutil

from bench import runner_log
from bench.central_throughput import FakeVm
from bench.fleet_traffic import HUB, PARTITIONS, SIGNER, send_signed
from bench.soak_report import RESULTS, SampleLog
from sandbox import processes

IN_BENCH = False  # a soak (hours): `make soak` runs it, not `python -m bench`
OUT = RESULTS / "central-soak.jsonl"
# Two of the 40 scale sets held for an operator (their events stay held until their VMs report them gone),
# the rest approved at once: approvals to the VMs' queues, held events and their alerts, each wave.
POLICY = {
    "version": 1,
    "rules": [
        {"name": "soak-hold", "action": "hold", "match": {"scaleSets": ["bench-0", "bench-1"]}},
        {"name": "soak-approve", "action": "approve"},
    ],
}


class SoakVm(FakeVm):
    """A FakeVm whose one maintenance event goes Scheduled -> Started -> gone (the document's own events)."""

    event: Optional[Dict[str, Any]] = None

    def step(self, at: datetime, status: Optional[str]) -> bytes:
        """The next incarnation: a new Scheduled event, the event at `status`, or (None) no event listed."""
        before = [self.event] if self.event else []
        if status == "Scheduled":
            event_id = f"SOAK-{self.vm_id[:8]}-{self.incarnation + 1}".upper()
            self.event = self.scheduled_reboot(event_id, at, "soak")
        elif status and self.event:
            self.event = {**self.event, "EventStatus": status, "NotBefore": ""}
        else:
            self.event = None
        self.incarnation += 1
        events = [self.event] if self.event else []
        changed = [{"before": before[0], "after": self.event}] if status == "Started" and before else []
        diff = {
            "new": events if status == "Scheduled" else [],
            "changed": changed,
            "gone": before if not events else [],
        }
        data = {
            "vm": self.identity(),
            "incarnation": self.incarnation,
            "previousIncarnation": self.incarnation - 1 or None,
            "reset": False,
            "apiVersion": "2020-07-01",
            "document": {"DocumentIncarnation": self.incarnation, "Events": events},
            "diff": diff,
            "observedAt": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        return self._wrap("incarnation", f"{self.vm_id}:incarnation:{self.incarnation}", data, at)


class LogCounter:
    """Envelopes a runner ingested, read incrementally from its log (the host's Executing/Executed lines)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.sizes, self.count = path, 0, {}, 0  # type: Dict[str, int]

    def ingested(self) -> int:
        if not self.path.exists():
            return self.count
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        text = chunk[:end].decode("utf-8", errors="replace")
        for n, invocation in runner_log.EXECUTING.findall(text):
            self.sizes[invocation] = int(n)
        for invocation in runner_log.SUCCEEDED.findall(text):
            self.count += self.sizes.pop(invocation, 0)
        return self.count


def table_counts(conn: str, prefix: str) -> Dict[str, int]:
    """Rows of every table of `prefix` (State by kind), and the head row's change-log lengths."""
    from azure.data.tables import TableServiceClient

    from central.store import head_log, state_rows

    kinds = {
        state_rows.VM: "state_vms",
        state_rows.ACTIVE: "state_active",
        state_rows.ENDED: "state_ended",
        state_rows.ALERT: "state_alerts",
        state_rows.NAME: "state_names",
    }
    out: Dict[str, int] = {}
    with TableServiceClient.from_connection_string(conn) as service:
        for table in service.list_tables():
            name = table.name
            if not name.startswith(prefix):
                continue
            client = service.get_table_client(name)
            short = name[len(prefix) :]
            if short != "State":
                out[short] = sum(1 for _ in client.list_entities(select=["RowKey"]))
                continue
            for row in client.list_entities():
                key = row["RowKey"]
                kind = next((v for k, v in kinds.items() if key.startswith(k)), None)
                if key == "head":
                    out["head_log_chars"] = len(row.get(head_log.COLUMN) or "")
                    out["head_vms_chars"] = len(row.get(head_log.VMS_COLUMN) or "")
                kind = kind or "state_other"  # head, book
                out[kind] = out.get(kind, 0) + 1
    return out


def _rss_mib(pid: int) -> Optional[float]:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return None


def runner_sample(
    server: processes.Server, counter: LogCounter, cpu_file: Path, probe: Path
) -> Dict[str, Any]:
    proc = psutil.Process(server.pid)
    with proc.oneshot():
        cpu = proc.cpu_times()
        out: Dict[str, Any] = {
            "rss_mib": proc.memory_info().rss / 2**20,
            "cpu_s": cpu.user + cpu.system,
            "threads": proc.num_threads(),
            "fds": proc.num_fds(),
        }
    out["invocation_cpu_s"] = runner_log.invocation_cpu([cpu_file])
    out["ingested"] = counter.ingested()
    try:
        out["probe"] = json.loads(probe.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        out["probe"] = {}
    return out


def start_runners(work: Path, count: int, settings: Dict[str, str], probe_seconds: float,
                  servers: List[processes.Server]) -> List[Tuple[processes.Server, Path]]:
    from tests.functions.conftest import RunnerFiles, start_runner

    out = []
    for i in range(count):
        files = RunnerFiles(work / f"central-{i}")
        files.write(
            {
                **settings,
                "SANDBOX_INVOCATION_CPU_FILE": str(files.directory / "invocation-cpu.json"),
                "SOAK_PROBE_FILE": str(files.directory / "probe.json"),
                "SOAK_PROBE_SECONDS": str(probe_seconds),
            }
        )
        out.append((start_runner(files, "bench.soak_probe"), files.directory))
        servers.append(out[-1][0])
    return out


class Load:
    """The fleet's traffic: heartbeats spread evenly over their interval, a wave each simulated hour."""

    def __init__(self, vms: List[SoakVm], args: argparse.Namespace) -> None:
        self.vms, self.args = vms, args
        self.beat_credit, self.next_beat, self.credited_until = 0.0, 0, 0.0
        self.waves = 0
        self.steps: List[Tuple[float, SoakVm, Optional[str]]] = []  # (due second, vm, status)
        self.published = 0
        self.lost = 0  # envelopes whose send failed (counted in published too)
        self.hub_restarts = 0

    def due(self, elapsed: float, now: datetime) -> List[bytes]:
        args, bodies = self.args, []
        # by the time that passed, not per call: a slow send stretches a tick, and the rate must not drop
        self.beat_credit += len(self.vms) * (elapsed - self.credited_until) / args.heartbeat_seconds
        self.credited_until = elapsed
        while self.beat_credit >= 1:
            bodies.append(self.vms[self.next_beat % len(self.vms)].heartbeat(now))
            self.next_beat += 1
            self.beat_credit -= 1
        if elapsed >= self.waves * args.hour_seconds + args.first_wave:
            size = max(1, int(len(self.vms) * args.wave))
            start = (self.waves * size) % len(self.vms)
            for vm in (self.vms + self.vms)[start : start + size]:
                if vm.event is None:
                    bodies.append(vm.step(now, "Scheduled"))
                    self.steps.append((elapsed + args.hour_seconds / 6, vm, "Started"))
                    self.steps.append((elapsed + args.hour_seconds / 3, vm, None))
            self.waves += 1
        for step in [s for s in self.steps if s[0] <= elapsed]:
            self.steps.remove(step)
            bodies.append(step[1].step(now, step[2]))
        self.published += len(bodies)
        return bodies


def soak(args: argparse.Namespace, work: Path, servers: List[processes.Server]) -> Path:
    """The run; every server and runner it starts is put in `servers` at once (the caller stops them
    whatever happens, a start-up that fails half-way included)."""
    from azure.eventhub import EventHubProducerClient
    from azure.eventhub.exceptions import EventHubError

    azurite = processes.start_azurite(log_dir=work)
    servers.append(azurite)
    hub_args = [f"{HUB}={PARTITIONS}", f"{processes.PLATFORM_HUB}=1"]
    hub = processes.start_eventhubs(hub_args, log_dir=work)
    servers.append(hub)
    hub_conn = processes.eventhubs_connection_string(hub.port, HUB)
    storage = azurite.extra["connection_string"]
    prefix = "soak"
    settings = {
        "AzureWebJobsStorage": storage,
        "ApprovalStorage": storage,
        **processes.central_hub_settings(hub.port, HUB),
        "EVENTHUB_CONSUMER_GROUP": "central",
        "TABLE_PREFIX": prefix,
        "POLICY_JSON": json.dumps(POLICY),
        "ALERT_WEBHOOK_URL": "",
        "ALERT_WEBHOOK_FORMAT": "generic",
        "REEVALUATE_SCHEDULE": "0 */1 * * * *",  # infra's default: every minute
        "AUTHN_TRUST_PEM": SIGNER.trust_pem,  # the sandbox's test root, nothing else
    }
    runners = start_runners(work, args.instances, settings, min(10.0, args.sample_seconds / 2), servers)
    log = SampleLog(args.out)
    counters = [LogCounter(d / "functions.log") for _, d in runners]
    load = Load([SoakVm(i) for i in range(args.vms)], args)
    producer = EventHubProducerClient.from_connection_string(
        processes.eventhubs_connection_string(hub.port, HUB)
    )
    print(
        f"central soak: {args.vms} VMs, {args.instances} runner(s) (PIDs "
        f"{', '.join(str(r.pid) for r, _ in runners)}), {args.hours} h; samples -> {args.out}; work {work}",
        flush=True,
    )
    started = time.monotonic()
    next_sample = started + args.sample_seconds
    try:
        while True:
            elapsed = time.monotonic() - started
            if elapsed >= args.hours * 3600:
                break
            bodies = load.due(elapsed, datetime.now(timezone.utc))
            if bodies:
                try:
                    send_signed(producer, bodies)
                except EventHubError as exc:  # counted, not fatal: the run goes on and says what it lost
                    load.lost += len(bodies)
                    print(f"[{elapsed / 60:6.1f} min] send failed ({exc.__class__.__name__}); {len(bodies)} "
                          "envelopes not published", flush=True)
                    if hub.proc.poll() is not None:  # the hub died (another process's kill): back, same port
                        hub = processes.start_eventhubs(hub_args, log_dir=work, port=hub.port)
                        servers.append(hub)
                        load.hub_restarts += 1
                    producer.close()
                    producer = EventHubProducerClient.from_connection_string(hub_conn)
            if time.monotonic() >= next_sample:
                next_sample += args.sample_seconds
                sample = {
                    "t": round(elapsed, 1),
                    "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "hour": elapsed / args.hour_seconds,
                    "real_hour": elapsed / 3600,
                    "published": load.published,
                    "lost": load.lost,
                    "hub_restarts": load.hub_restarts,
                    "waves": load.waves,
                    "runners": [
                        runner_sample(r, c, d / "invocation-cpu.json", d / "probe.json")
                        for (r, d), c in zip(runners, counters)
                    ],
                    "tables": table_counts(storage, prefix),
                    "azurite_rss_mib": _rss_mib(azurite.pid),
                    "eventhubs_rss_mib": _rss_mib(hub.pid),
                }
                log.add(sample)
                r0 = sample["runners"][0]
                print(
                    f"[{elapsed / 60:6.1f} min] published {load.published} ingested "
                    f"{sum(r['ingested'] for r in sample['runners'])}; runner 0 RSS {r0['rss_mib']:.1f} MiB; "
                    f"tables {sample['tables']}",
                    flush=True,
                )
            time.sleep(max(0.0, started + elapsed + args.tick - time.monotonic()))
    finally:
        log.close()
        producer.close()
        for r, _ in runners:
            r.stop()
        hub.stop()
        azurite.stop()
    return args.out


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.central_soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--hours", type=float, default=2.0, help="real hours of load")
    parser.add_argument("--vms", type=int, default=1000)
    parser.add_argument("--instances", type=int, default=2, help="runner processes sharing the hub and store")
    parser.add_argument("--heartbeat-seconds", type=float, default=60.0)
    parser.add_argument("--hour-seconds", type=float, default=600.0, help="real seconds per simulated hour")
    parser.add_argument("--first-wave", type=float, default=60.0, help="seconds before the first wave")
    parser.add_argument("--wave", type=float, default=0.05, help="share of the VMs in each wave")
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between publishes")
    parser.add_argument("--out", type=Path, default=OUT, help="samples (JSON lines), appended as taken")
    parser.add_argument("--report", type=Path, help="only print the figures of an existing samples file")
    parser.add_argument("--work", type=Path, help="keep the runners' logs here (default: a temporary dir)")
    args = parser.parse_args(argv)
    # SIGTERM (nohup'd runs ignore SIGINT) ends the run through its finally: servers stopped, samples kept
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from bench.central_soak_report import report

    if args.report:
        return report(args.report, args.hour_seconds)
    if args.out.exists():
        args.out.unlink()  # a new run: its own samples only
    servers: List[processes.Server] = []
    try:
        if args.work:
            args.work.mkdir(parents=True, exist_ok=True)
            soak(args, args.work, servers)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                soak(args, Path(tmp), servers)
    finally:
        for server in servers:  # stopped already unless the start-up failed half-way
            server.stop()
    return report(args.out, args.hour_seconds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
