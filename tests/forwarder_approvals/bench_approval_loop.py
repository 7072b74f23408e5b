"""Benchmark: the approval loop through a real `se-forwarder run` process, the IMDS simulator and Azurite.

Prints (no assertions; timing goals live here, not in tests):
- queue latency: approval message enqueued -> StartRequests POST received by IMDS (median, p99), with
  the production pace (IMDS poll 1 s, queue fast interval 2 s while a Scheduled event exists);
- fast path: a Preempt appears in IMDS -> local approval POST received (median, p99);
- idle queue transactions per VM-hour: receives counted over an idle window at a short slow interval,
  scaled to the production slow interval (60 s).

Run: .venv/bin/python -m tests.forwarder_approvals.bench_approval_loop [N]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

from azure.storage.queue import QueueClient

from forwarder.approvals import naming
from sandbox import processes
from sandbox.imds.client import ImdsSimulator, wait_for

from .helpers import VM0, approval, make_rig


def _pct(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _forwarder(sim: ImdsSimulator, conn: str, tmp: Path, extra: Dict[str, str]) -> subprocess.Popen:
    (tmp / "config.json").write_text("{}")
    env = {
        **os.environ,
        "SE_FORWARDER_IMDS_URL": sim.vm_url("vm0"),
        "SE_FORWARDER_STATE_DIR": str(tmp / "s"),
        "SE_FORWARDER_SINK": "file",
        "SE_FORWARDER_SINK_FILE": str(tmp / "out.jsonl"),
        "SE_FORWARDER_QUEUE_CONNECTION_STRING": conn,
        "SE_FORWARDER_HOOK_DIR": str(tmp / "hooks"),
        "SE_FORWARDER_CONFIG": str(tmp / "config.json"),
        "SE_FORWARDER_LOG_LEVEL": "warning",
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "forwarder", "run"],
        env=env,
        cwd=processes.REPO,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "fwd.log", "wb"),
    )


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def _incarnations(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"scheduledevents.incarnation.v1"' in line)


def queue_latency(sim: ImdsSimulator, conn: str, tmp: Path, n: int) -> List[float]:
    queue = QueueClient.from_connection_string(conn, naming.queue_name(VM0["vmId"]))
    queue.create_queue()
    proc = _forwarder(
        sim, conn, tmp, {"SE_FORWARDER_POLL_INTERVAL": "1", "SE_FORWARDER_APPROVAL_FAST_INTERVAL": "2"}
    )
    out, latencies = tmp / "out.jsonl", []
    try:
        wait_for(lambda: _incarnations(out) >= 1, timeout=30, interval=0.1)
        for _ in range(n):
            seen = _incarnations(out)
            event_id = sim.add_event(
                eventType="Reboot", eventSource="User", resources=["vm0"], startedSeconds=0
            )["eventId"]
            wait_for(
                lambda seen=seen: _incarnations(out) > seen, timeout=30, interval=0.05
            )  # what central reacts to
            sent = time.time()
            queue.send_message(json.dumps(approval(event_id)))
            posts = wait_for(
                lambda event_id=event_id: [
                    r for r in sim.requests(vm="vm0", method="POST") if event_id in r["body"]
                ],
                timeout=30,
                interval=0.05,
            )
            latencies.append(posts[0]["t"] - sent)
            wait_for(lambda: not sim.document("vm0")["Events"], timeout=30, interval=0.1)
    finally:
        _stop(proc)
        queue.close()
    return latencies


def fastpath_latency(sim: ImdsSimulator, conn: str, tmp: Path, n: int) -> List[float]:
    proc = _forwarder(
        sim, conn, tmp, {"SE_FORWARDER_POLL_INTERVAL": "1", "SE_FORWARDER_LOCAL_APPROVE": "true"}
    )
    latencies = []
    try:
        wait_for(lambda: _incarnations(tmp / "out.jsonl") >= 1, timeout=30, interval=0.1)
        for _ in range(n):
            created = time.time()
            event_id = sim.add_event(eventType="Preempt", resources=["vm0"], startedSeconds=0)["eventId"]
            posts = wait_for(
                lambda event_id=event_id: [
                    r for r in sim.requests(vm="vm0", method="POST") if event_id in r["body"]
                ],
                timeout=30,
                interval=0.05,
            )
            latencies.append(posts[0]["t"] - created)
            wait_for(lambda: not sim.document("vm0")["Events"], timeout=30, interval=0.1)
    finally:
        _stop(proc)
    return latencies


def idle_receives_per_hour(sim: ImdsSimulator, conn: str, tmp: Path, seconds: float = 10.0) -> float:
    """Queue receives per VM-hour while this VM's IMDS document lists no event: the approval worker's own
    loop (as the daemon runs it) for `seconds`, fed the idle document; receives counted by the reader,
    if the worker ever built one (it reads only while an event naming this VM is Scheduled)."""
    rig = make_rig(sim.base_url, conn, tmp)
    rig.observe()  # no events
    stop = threading.Event()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rig.service.step(stop)
    reader = rig.service.reader
    receives = reader.stats["receives"] if reader is not None else 0
    rig.service.close()
    rig.queue.close()
    rig.outbox.close()
    return receives / seconds * 3600.0


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    azurite = processes.start_azurite()
    imds = processes.start_imds(["--time-scale", "60", "--vm", json.dumps(VM0)])
    sim = ImdsSimulator(f"http://127.0.0.1:{imds.port}")
    conn = azurite.extra["connection_string"]
    try:
        with (
            tempfile.TemporaryDirectory() as a,
            tempfile.TemporaryDirectory() as b,
            tempfile.TemporaryDirectory() as c,
        ):
            q = queue_latency(sim, conn, Path(a), n)
            print(
                f"queue loop (enqueue -> POST at IMDS), n={len(q)}, fast interval 2 s: "
                f"median {statistics.median(q):.2f} s, p99 {_pct(q, 0.99):.2f} s, max {max(q):.2f} s"
            )
            # real time (scale 1) for the fast path: a Preempt's 30 s of notice is 30 s, as on Azure
            realtime = processes.start_imds(["--time-scale", "1", "--vm", json.dumps(VM0)])
            try:
                f = fastpath_latency(
                    ImdsSimulator(f"http://127.0.0.1:{realtime.port}"), conn, Path(b), max(5, n // 2)
                )
            finally:
                realtime.stop()
            print(
                f"fast path (Preempt appears -> local POST at IMDS), n={len(f)}, IMDS poll 1 s: "
                f"median {statistics.median(f):.2f} s, p99 {_pct(f, 0.99):.2f} s, max {max(f):.2f} s"
            )
            sim.reset()
            idle = idle_receives_per_hour(sim, conn, Path(c))
            print(f"idle queue transactions per VM-hour (no event listed: no reads): {idle:.0f}")
    finally:
        sim.close()
        imds.stop()
        azurite.kill()


if __name__ == "__main__":
    main()
