"""The forwarder's footprint while idle: RSS and CPU % over 60 s of polling IMDS at 1 Hz.

    python -m bench.forwarder_footprint [--seconds 60] [--warmup 5]

Two configurations, each a real forwarder process against the simulator: the minimal one (file
sink, no approvals) and the one a VM runs (Event Hubs sink to the sandbox server and the approval
queue reader on Azurite, so the Azure SDKs are loaded). psutil samples RSS every second and CPU time
at the start and end of the window.
Goal: RSS <= 60 MB, CPU <= 1 % of one core.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import psutil
import requests

from bench import Figure, record
from sandbox import processes

MB = 1024 * 1024


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forwarder_footprint")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    args = parser.parse_args(argv)
    figures: List[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "config.json").write_text("{}")
        imds = processes.start_imds(["--time-scale", "1"], log_dir=work)
        azurite = processes.start_azurite(log_dir=work)
        hub = processes.start_eventhubs(["scheduled-events=4"], log_dir=work)
        try:
            minimal = ["--sink", "file", "--sink-file", str(work / "out.jsonl")]
            # What a VM runs: Event Hubs sink and the approval-queue reader (azure SDKs loaded).
            production = ["--sink", "eventhub", "--eventhub-name", "scheduled-events"]
            production_env = {
                "SE_FORWARDER_EVENTHUB_CONNECTION_STRING":
                    processes.eventhubs_connection_string(hub.port, "scheduled-events"),
                "SE_FORWARDER_QUEUE_CONNECTION_STRING": azurite.extra["connection_string"],
            }
            for label, extra, extra_env in (("file sink, no approvals", minimal, {}),
                                            ("Event Hubs sink + approval queue", production, production_env)):
                figures += _measure(label, work / label.split()[0], imds, extra, extra_env, args)
        finally:
            for server in (hub, azurite, imds):
                server.stop()
    record(figures)
    return 0


def _measure(label: str, work: Path, imds: processes.Server, extra: List[str], extra_env: dict,
             args: argparse.Namespace) -> List[Figure]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
    env.update(extra_env)
    fw = subprocess.Popen(
        [sys.executable, "-m", "forwarder", "run", "--config", str(work.parent / "config.json"),
         "--imds-url", f"http://{processes.LOOPBACK}:{imds.port}/vms/vm0",
         "--state-dir", str(work / "state"), "--poll-interval", "1", *extra],
        cwd=processes.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        proc = psutil.Process(fw.pid)
        time.sleep(args.warmup)  # imports, first poll, first heartbeat and send
        if fw.poll() is not None:
            raise RuntimeError(f"the forwarder ({label}) exited with {fw.returncode}")
        before = _polls(imds.port)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        rss: List[int] = []
        end = t0 + args.seconds
        while time.monotonic() < end:
            rss.append(proc.memory_info().rss)
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        cpu1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        polls = _polls(imds.port) - before
    finally:
        if fw.poll() is None:
            os.kill(fw.pid, signal.SIGTERM)
            fw.wait(timeout=15)
    cpu_pct = 100.0 * (cpu1 - cpu0) / (t1 - t0)
    rss_max, rss_mean = max(rss) / MB, sum(rss) / len(rss) / MB
    print(f"forwarder ({label}) idle for {t1 - t0:.0f} s, polling at 1 Hz "
          f"({polls} GETs to scheduledevents seen by IMDS):")
    print(f"  RSS max {rss_max:.1f} MB, mean {rss_mean:.1f} MB (goal <= 60)   CPU {cpu_pct:.2f} % of a core "
          f"(goal <= 1)")
    name = "forwarder_footprint"
    return [
        Figure(name, f"RSS max, idle 1 Hz ({label})", round(rss_max, 1), "MB", "<= 60", rss_max <= 60),
        Figure(name, f"RSS mean, idle 1 Hz ({label})", round(rss_mean, 1), "MB", "", None),
        Figure(name, f"CPU, idle 1 Hz ({label})", round(cpu_pct, 2), "% core", "<= 1", cpu_pct <= 1),
        Figure(name, f"IMDS polls in the window ({label})", polls, "GET", "", None),
    ]


def _polls(port: int) -> int:
    session = requests.Session()
    session.trust_env = False
    resp = session.get(f"http://{processes.LOOPBACK}:{port}/admin/requests",
                       params={"vm": "vm0", "method": "GET", "path": "scheduledevents"}, timeout=10)
    resp.raise_for_status()
    return len(resp.json())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
