"""Forwarder soak (issue 50, item 1): the production forwarder for 30 simulated days on a sped-up clock,
sampled, and judged flat after warm-up.

    python -m bench.forwarder_soak [--days 30] [--speed 1200] [--out bench/results/forwarder-soak.jsonl]
    python -m bench.forwarder_soak --report bench/results/forwarder-soak.jsonl   # the figures of a run

The set-up is bench.forwarder_footprint's production agent: the pinned VM venv (.venv-vm), the Event Hubs
sink over TLS with managed identity (the sandbox server's REST endpoint behind a TLS relay on
127.0.0.50:443), signing on, the approval queue on Azurite over HTTPS with managed identity (tokens from
the IMDS simulator), a pre-approve hook installed. Only the clock's pace differs.

How the clock is sped up, and why this way: the IMDS simulator's own --time-scale (notice and Started
times pass --speed times faster; NotBefore stays a real instant, so the forwarder compares it with its
real clock exactly as on Azure) plus the forwarder's own configurable intervals divided by --speed
(heartbeat 60 s, Event Hubs idle close 20 s; the approval-queue fast read 2 s, at least 0.25 s), and the
simulator's tokens made to last --token-lifetime real seconds. Not libfaketime: the forwarder times its
work on the monotonic clock (threading waits: sem_clockwait, which libfaketime does not speed up), so a
faked wall clock would only move NotBefore, token expiry and envelope timestamps out of step with the
simulator, the hub and Azurite (tools/faketime_site documents the pitfalls on this machine). What cannot
be sped up honestly, said plainly:
  - polling: IMDS allows 5 requests/s per VM, so the forwarder refuses a poll interval under 0.25 s; it
    polls at 4 Hz real, i.e. 4 / --speed per simulated second (288 polls per simulated day at 1200x, not
    86,400). Anything that leaked per poll would show 300 times slower than on a VM;
  - token refresh: the forwarder never hands out a token within 300 real seconds of its expiry
    (forwarder/credential.py REFRESH_MARGIN) and refreshes at half its life, so tokens last 720 real
    seconds: a refresh every 6 real minutes (about 5 simulated days at 1200x), each kind of token.
Per simulated day: an event every --event-hours (4) simulated hours, in turn approved (central's approval
put on the VM's queue), hook-run (hook-then-approve: the pre-approve hook runs, then the POST), held (no
approval: the event starts at its NotBefore) and expired (an approval whose expiresAt has passed);
heartbeats; an Event Hubs outage (--outage-minutes simulated minutes, the relay refusing connections;
day 0's lasts --warmup-outage-minutes, so the warm-up drains a full send batch: the largest the sender makes);
and, once (--rotate-day), a log rotation. The forwarder logs to stderr (journald on a VM); this bench
stands in for journald: it keeps the log in a file rotated at --log-max-bytes or on --rotate-day, one
rotated file kept.
Sampled every simulated hour, appended at once to --out: RSS, open fds, threads, CPU, the outbox file
(database, WAL and shared memory) and its rows, the state directory, the log bytes written and on disk.
Per simulated day: IMDS requests by kind (polls, tokens, attested documents, approval POSTs), hook runs.
Rules (PASS/FAIL, bench.forwarder_soak_report): RSS within +1 MiB of the first day's median (day 0 is the
warm-up: every path's first use; the first day is day 1); no fd or thread added; the outbox back to its
floor after each outage; logs bounded by the rotation. Bounded: --days x 86,400 / --speed real seconds;
every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Any, Dict, List, Optional

from bench.forwarder_footprint import (
    HUB,
    HUB_PORT,
    cpu_seconds,
    production_args,
    production_env,
    rss_bytes,
    trust_env,
    unit_env,
    vm_python,
)
from bench.soak_report import RESULTS, SampleLog
from bench.tlsrelay import TlsRelay, make_certificate
from sandbox import processes

IN_BENCH = False  # a soak (a simulated month): `make soak` runs it, not `python -m bench`
OUT = RESULTS / "forwarder-soak.jsonl"
DAY = 86400.0
VM = {"name": "vm0", "vmId": "50a0a0a0-5050-4050-8050-000000000050"}
KINDS = ("approved", "hook-run", "held", "expired")
MIB = 1024 * 1024
# The namespace's loopback address: its own, not bench.forwarder_footprint's 127.0.0.13, so the two (or a
# fault test using that one) can run at the same time on port 443.
HUB_HOST = "127.0.0.50"


class RotatingLog:
    """journald's part: the forwarder's stderr kept in a file, rotated by size or on demand (one kept)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.written = 0  # every byte the forwarder wrote
        self.rotations = 0
        self._out: IO[bytes] = open(path, "ab")
        self._lock = threading.Lock()

    def pump(self, stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            with self._lock:
                self._out.write(line)
                self._out.flush()
                self.written += len(line)
                if self._out.tell() >= self.max_bytes:
                    self._rotate()

    def rotate(self) -> None:
        with self._lock:
            self._rotate()

    def _rotate(self) -> None:
        self._out.close()
        os.replace(self.path, self.path.with_suffix(".log.1"))
        self._out = open(self.path, "ab")
        self.rotations += 1

    def on_disk(self) -> int:
        return sum(p.stat().st_size for p in (self.path, self.path.with_suffix(".log.1")) if p.exists())

    def close(self) -> None:
        with self._lock:
            self._out.close()


def outbox_figures(state: Path) -> Dict[str, Any]:
    files = [state / n for n in ("outbox.sqlite3", "outbox.sqlite3-wal", "outbox.sqlite3-shm")]
    out: Dict[str, Any] = {
        "outbox_bytes": sum(p.stat().st_size for p in files if p.exists()),
        "state_bytes": sum(p.stat().st_size for p in state.rglob("*") if p.is_file()),
    }
    try:
        db = sqlite3.connect(f"file:{files[0]}?mode=ro", uri=True, timeout=5)
        try:
            out["outbox_rows"] = db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error:
        out["outbox_rows"] = None  # busy past the timeout: a gap in the series, not a zero
    return out


def process_figures(pid: int) -> Dict[str, Any]:
    threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    return {"rss_mib": rss_bytes(pid) / MIB, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": threads,
            "cpu_s": cpu_seconds(pid)}


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Central:
    """What central does for the soak's events: an approval message on the VM's queue (or none)."""

    def __init__(self, conn: str, cert: Path) -> None:
        from azure.storage.queue import QueueClient

        from forwarder.approvals import naming

        self.queue = QueueClient.from_connection_string(
            conn, naming.queue_name(VM["vmId"]), connection_verify=str(cert)
        )
        self.queue.create_queue()

    def approve(self, event_id: str, action: str, expires_in: float) -> None:
        now = datetime.now(timezone.utc)
        message = {"schemaVersion": 1, "messageId": str(uuid.uuid4()), "eventId": event_id,
                   "vmId": VM["vmId"], "vmName": VM["name"], "action": action, "decidedBy": "policy:soak",
                   "reason": "soak", "issuedAt": iso(now - timedelta(seconds=max(0.0, -expires_in) + 1)),
                   "expiresAt": iso(now + timedelta(seconds=expires_in)), "incarnation": 1}
        self.queue.send_message(json.dumps(message))

    def close(self) -> None:
        self.queue.close()


def request_counts(sim: Any) -> Dict[str, int]:
    """The VM's IMDS requests since the last call, by kind (the simulator's log, cleared after reading)."""
    found = sim.requests(vm=VM["name"])
    sim.admin("DELETE", "/requests")
    counts = {"polls": 0, "tokens": 0, "attested": 0, "posts": 0, "other": 0}
    for r in found:
        path = r.get("path", "")
        kind = (
            ("posts" if r.get("method") == "POST" else "polls")
            if "scheduledevents" in path
            else ("tokens" if "oauth2/token" in path else "attested" if "attested" in path else "other")
        )
        counts[kind] += 1
    return counts


def forwarder_argv(python: Path, args: argparse.Namespace, imds_port: int, queue_port: int,
                   work: Path) -> List[str]:
    s = args.speed
    namespace = args.hub_host if args.hub_port == 443 else f"{args.hub_host}:{args.hub_port}"
    return [str(python), "-m", "forwarder", "run", "--config", str(work / "empty.json"),
            "--imds-url", f"http://{processes.LOOPBACK}:{imds_port}/vms/{VM['name']}",
            "--state-dir", str(work / "state"), "--poll-interval", "0.25", "--log-level", args.log_level,
            "--heartbeat-interval", f"{60.0 / s:.6f}", "--eventhub-idle-close", f"{20.0 / s:.6f}",
            "--approval-fast-interval", f"{max(0.25, 2.0 / s):.6f}", "--hook-dir", str(work / "hooks"),
            *production_args(namespace, queue_port)]


def install_hook(work: Path) -> Path:
    runs = work / "hook-runs"
    hook = work / "hooks" / "pre-approve.d" / "10-soak"
    hook.parent.mkdir(parents=True)
    hook.write_text(f"#!/bin/sh\necho ran >> {runs}\n")
    hook.chmod(0o755)
    return runs


class Plan:
    """The simulated timeline: events, outages, the rotation, samples; each action once, when due."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.next_event = args.event_hours * 3600 / 2
        self.events = 0
        self.day = 0
        self.outage_day = -1  # the last day whose outage started
        self.rotated = False

    def event_due(self, sim_s: float) -> Optional[str]:
        if sim_s < self.next_event:
            return None
        self.next_event += self.args.event_hours * 3600
        kind = KINDS[self.events % len(KINDS)]
        self.events += 1
        return kind


def soak(args: argparse.Namespace, work: Path, python: Path, servers: List[processes.Server]) -> None:
    """The run; every server it starts is put in `servers` at once (the caller stops them whatever
    happens, a start-up that fails half-way included)."""
    from sandbox.imds.client import ImdsSimulator

    (work / "empty.json").write_text("{}")
    cert, key = make_certificate(work, (processes.LOOPBACK, args.hub_host))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SE_FORWARDER_", "PYTHON"))}
    env.update(trust_env(cert, work))
    imds = processes.start_imds(["--time-scale", str(args.speed), "--vm", json.dumps(VM),
                                 "--token-lifetime", str(args.token_lifetime)], log_dir=work)
    servers.append(imds)
    hub = processes.start_eventhubs([f"{HUB}=4"], log_dir=work, rest=True)
    servers.append(hub)
    azurite = processes.start_azurite(log_dir=work, oauth_tls=(cert, key))
    servers.append(azurite)
    relay: Optional[TlsRelay] = TlsRelay(cert, key, hub.ports["rest"], host=args.hub_host, port=args.hub_port)
    conn = azurite.extra["connection_string"].replace("http://", "https://")
    central = Central(conn, cert)
    sim = ImdsSimulator(f"http://{processes.LOOPBACK}:{imds.port}")
    hook_runs = install_hook(work)
    log = RotatingLog(work / "forwarder.log", args.log_max_bytes)
    samples = SampleLog(args.out)
    env.update(production_env(f"http://{processes.LOOPBACK}:{imds.port}/vms/{VM['name']}"))  # the unit's too
    argv = forwarder_argv(python, args, imds.port, azurite.ports["queue"], work)
    proc = subprocess.Popen(argv,
                            cwd=processes.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    threading.Thread(target=log.pump, args=(proc.stdout,), daemon=True, name="journald").start()
    plan = Plan(args)
    samples.add({"kind": "config", "argv": " ".join(args.argv), "speed": args.speed, "days": args.days,
                 "log_max_bytes": args.log_max_bytes, "token_lifetime": args.token_lifetime,
                 "forwarder": argv[3:], "environment": unit_env()})
    print(f"forwarder soak: {args.days} simulated days at {args.speed:g}x "
          f"(~{args.days * DAY / args.speed / 60:.0f} real min); forwarder PID {proc.pid}; "
          f"samples -> {args.out}; work {work}", flush=True)
    started = time.monotonic()
    next_sample, day_written, outage_end, hub_restarts = 0.0, 0, 0.0, 0
    try:
        while True:
            sim_s = (time.monotonic() - started) * args.speed
            if proc.poll() is not None:
                raise RuntimeError(f"the forwarder exited ({proc.returncode}); see {log.path}")
            if sim_s >= (plan.day + 1) * DAY or sim_s >= args.days * DAY:  # the day's own figures
                runs = len(hook_runs.read_text().splitlines()) if hook_runs.exists() else 0
                samples.add({"kind": "day", "day": plan.day, "log_bytes": log.written - day_written,
                             "hook_runs_total": runs, "rotations": log.rotations, **request_counts(sim)})
                day_written, plan.day = log.written, plan.day + 1
                if sim_s >= args.days * DAY:
                    break
            kind = plan.event_due(sim_s)
            if kind:
                open_event(sim, central, kind, args)
            if hub.proc.poll() is not None:  # killed from outside (it happened once): back on its AMQP port
                hub = processes.start_eventhubs([f"{HUB}=4"], log_dir=work, rest=True, port=hub.port)
                servers.append(hub)
                hub_restarts += 1
                if relay is not None:  # its REST port is new: the relay follows it
                    relay.stop()
                    relay = TlsRelay(cert, key, hub.ports["rest"], host=args.hub_host, port=args.hub_port)
            today = int(sim_s // DAY)
            outage_due = plan.outage_day < today and sim_s >= (today + args.outage_hour / 24) * DAY
            if relay is not None and outage_due:
                relay.stop()  # Event Hubs unreachable: connections refused until it is back
                minutes = args.warmup_outage_minutes if today == 0 else args.outage_minutes
                relay, plan.outage_day, outage_end = None, today, sim_s + minutes * 60
            elif relay is None and sim_s >= outage_end:
                samples.add({"kind": "outage", "day": today, "sim_s": round(sim_s),  # its backlog at the end
                             "rows_at_end": outbox_figures(work / "state")["outbox_rows"]})
                relay = TlsRelay(cert, key, hub.ports["rest"], host=args.hub_host, port=args.hub_port)
            if not plan.rotated and sim_s >= args.rotate_day * DAY:
                log.rotate()
                plan.rotated = True
            if sim_s >= next_sample:
                next_sample += 3600
                samples.add({"kind": "sample", "sim_s": round(sim_s), "day": sim_s / DAY,
                             "t": round(time.monotonic() - started, 1), "outage": relay is None,
                             "log_written": log.written, "log_on_disk": log.on_disk(),
                             "rotations": log.rotations, "hub_restarts": hub_restarts,
                             **process_figures(proc.pid), **outbox_figures(work / "state")})
            time.sleep(0.05)
    finally:
        samples.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
        central.close()
        sim.close()
        if relay is not None:
            relay.stop()
        for server in (azurite, hub, imds):
            server.stop()


def open_event(sim: Any, central: Central, kind: str, args: argparse.Namespace) -> None:
    """A Reboot for the VM and what central does about it: approve, approve after the hook, nothing (held),
    or an approval already past its expiry."""
    event = sim.add_event(eventType="Reboot", resources=[VM["name"]], noticeSeconds=args.notice_minutes * 60,
                          startedSeconds=600)
    if kind != "held":
        real_notice = args.notice_minutes * 60 / args.speed
        central.approve(event["eventId"], "hook-then-approve" if kind == "hook-run" else "approve",
                        -60.0 if kind == "expired" else real_notice + 60)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forwarder_soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=30.0, help="simulated days")
    parser.add_argument("--speed", type=float, default=1200.0, help="simulated seconds per real second")
    parser.add_argument("--event-hours", type=float, default=4.0, help="simulated hours between events")
    parser.add_argument("--notice-minutes", type=float, default=30.0, help="an event's notice (simulated)")
    parser.add_argument("--outage-hour", type=float, default=12.0, help="the daily outage's start (hour)")
    parser.add_argument("--outage-minutes", type=float, default=60.0, help="each outage (simulated)")
    parser.add_argument("--warmup-outage-minutes", type=float, default=180.0,
                        help="day 0's outage: long enough for a full send batch (100) to pile up, so the "
                             "warm-up drains the largest batch the sender makes")
    parser.add_argument("--rotate-day", type=float, help="the day of the forced rotation (default: mid-run)")
    parser.add_argument("--log-max-bytes", type=int, default=8 * MIB, help="rotate the log past this size")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--token-lifetime", type=int, default=720, help="real seconds a token lasts")
    parser.add_argument("--out", type=Path, default=OUT, help="samples (JSON lines), appended as taken")
    parser.add_argument("--report", type=Path, help="only print the figures of an existing samples file")
    parser.add_argument("--work", type=Path, help="keep the state dir and logs here (default: temporary)")
    parser.add_argument("--python", type=Path, help="the forwarder's Python (default: the pinned VM venv)")
    parser.add_argument("--hub-host", default=HUB_HOST, help="the namespace's loopback address")
    parser.add_argument("--hub-port", type=int, default=HUB_PORT, help="its HTTPS port (443 needs root)")
    args = parser.parse_args(argv)
    # SIGTERM (nohup'd runs ignore SIGINT) ends the run through its finally: servers stopped, samples kept
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.argv = argv
    if args.rotate_day is None:
        args.rotate_day = args.days / 2
    from bench.forwarder_soak_report import report

    if args.report:
        return report(args.report)
    python = args.python or vm_python()
    if args.out.exists():
        args.out.unlink()
    servers: List[processes.Server] = []
    try:
        if args.work:
            args.work.mkdir(parents=True, exist_ok=True)
            soak(args, args.work, python, servers)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                soak(args, Path(tmp), python, servers)
    finally:
        for server in servers:  # stopped already unless the start-up failed half-way
            server.stop()
    return report(args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
