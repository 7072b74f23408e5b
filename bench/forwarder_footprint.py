"""The forwarder's footprint while idle: RSS and CPU % over 60 s of polling IMDS at 1 Hz.

    python -m bench.forwarder_footprint [--seconds 60] [--warmup 5]

The simulator and the forwarder (file sink, default heartbeat interval) run as processes; psutil
samples the forwarder's RSS every second and its CPU time at start and end of the window.
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
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "config.json").write_text("{}")
        imds = processes.start_imds(["--time-scale", "1"], log_dir=work)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
        fw = subprocess.Popen(
            [sys.executable, "-m", "forwarder", "run", "--config", str(work / "config.json"),
             "--imds-url", f"http://{processes.LOOPBACK}:{imds.port}/vms/vm0",
             "--state-dir", str(work / "state"), "--sink", "file", "--sink-file", str(work / "out.jsonl"),
             "--poll-interval", "1"],
            cwd=processes.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            proc = psutil.Process(fw.pid)
            time.sleep(args.warmup)  # imports, first poll, first heartbeat
            if fw.poll() is not None:
                raise RuntimeError(f"the forwarder exited with {fw.returncode}")
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
            imds.stop()
    cpu_pct = 100.0 * (cpu1 - cpu0) / (t1 - t0)
    rss_max, rss_mean = max(rss) / MB, sum(rss) / len(rss) / MB
    print(f"forwarder idle for {t1 - t0:.0f} s, polling at 1 Hz "
          f"({polls} GETs to scheduledevents seen by IMDS):")
    print(f"  RSS max {rss_max:.1f} MB, mean {rss_mean:.1f} MB (goal <= 60)   CPU {cpu_pct:.2f} % of a core "
          f"(goal <= 1)")
    name = "forwarder_footprint"
    record([
        Figure(name, "RSS max (idle, 1 Hz)", round(rss_max, 1), "MB", "<= 60", rss_max <= 60),
        Figure(name, "RSS mean (idle, 1 Hz)", round(rss_mean, 1), "MB", "", None),
        Figure(name, "CPU (idle, 1 Hz)", round(cpu_pct, 2), "% core", "<= 1", cpu_pct <= 1),
        Figure(name, "IMDS polls in the window", polls, "GET", "", None),
    ])
    return 0


def _polls(port: int) -> int:
    session = requests.Session()
    session.trust_env = False
    resp = session.get(f"http://{processes.LOOPBACK}:{port}/admin/requests",
                       params={"vm": "vm0", "method": "GET", "path": "scheduledevents"}, timeout=10)
    resp.raise_for_status()
    return len(resp.json())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
