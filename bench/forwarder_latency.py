"""IMDS change -> outbox row latency, forwarder polling at 1 Hz (the production interval).

    python -m bench.forwarder_latency [--changes 30] [--poll-interval 1.0]

The simulator (time scale 1, so nothing else changes) and the forwarder run as processes. For each
change the bench schedules an event through the admin API (the change instant is the midpoint of
that POST) and waits for the outbox row carrying it; the row's `created_at` (written in the same
transaction as the state) is the arrival. The sink is made to fail on purpose so rows stay in the
outbox to be read. Changes are spaced by a random 0.3-1.3 s so they land at every phase of the poll
cycle. Goal: median <= 0.6 s, p99 <= 1.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import requests

from bench import Figure, median, percentile, record
from sandbox import processes


def row_time(db: Path, event_id: str) -> Optional[float]:
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        for created_at, body in conn.execute(
                "SELECT created_at, body FROM outbox WHERE type = 'scheduledevents.incarnation.v1' "
                "ORDER BY seq DESC LIMIT 5"):
            events = json.loads(body)["data"]["document"]["Events"]
            if any(e["EventId"] == event_id for e in events):
                return float(created_at)
    except sqlite3.OperationalError:
        return None  # the table is not created yet
    finally:
        conn.close()
    return None


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forwarder_latency")
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    rng = random.Random()  # spacing only, not security
    session = requests.Session()
    session.trust_env = False
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "blocker").write_text("a file, so the sink cannot create its directory")
        (work / "config.json").write_text("{}")
        imds = processes.start_imds(["--time-scale", "1"], log_dir=work)
        admin = f"http://{processes.LOOPBACK}:{imds.port}/admin"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
        fw = subprocess.Popen(
            [sys.executable, "-m", "forwarder", "run", "--config", str(work / "config.json"),
             "--imds-url", f"http://{processes.LOOPBACK}:{imds.port}/vms/vm0",
             "--state-dir", str(work / "state"), "--sink", "file",
             "--sink-file", str(work / "blocker" / "out.jsonl"), "--poll-interval", str(args.poll_interval),
             "--heartbeat-interval", "3600", "--log-level", "error"],
            cwd=processes.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        db = work / "state" / "outbox.sqlite3"
        latencies: List[float] = []
        try:
            deadline = time.monotonic() + 30
            while not (db.exists() and _rows(db) > 0):  # the first incarnation is in
                if time.monotonic() > deadline:
                    raise RuntimeError("the forwarder never wrote its first incarnation")
                time.sleep(0.1)
            for _ in range(args.changes):
                time.sleep(rng.uniform(0.3, 1.3))
                t0 = time.time()
                resp = session.post(f"{admin}/events", json={"eventType": "Freeze", "noticeSeconds": 900},
                                    timeout=10)
                t1 = time.time()
                resp.raise_for_status()
                event_id = resp.json()["eventId"]
                change_at = (t0 + t1) / 2
                wait_until = time.monotonic() + 15
                arrived = None
                while arrived is None and time.monotonic() < wait_until:
                    arrived = row_time(db, event_id)
                    if arrived is None:
                        time.sleep(0.02)
                if arrived is None:
                    raise RuntimeError(f"event {event_id} never reached the outbox")
                latencies.append(arrived - change_at)
        finally:
            if fw.poll() is None:
                os.kill(fw.pid, signal.SIGTERM)
                fw.wait(timeout=15)
            imds.stop()
    med, p99 = median(latencies), percentile(latencies, 99)
    print(f"IMDS change -> outbox row, polling every {args.poll_interval:g} s, {len(latencies)} changes:")
    print(f"  median {med:.3f} s (goal <= 0.6)   p99 {p99:.3f} s (goal <= 1.2)   "
          f"min {min(latencies):.3f}   max {max(latencies):.3f}")
    record([
        Figure("forwarder_latency", "change->outbox median", round(med, 3), "s", "<= 0.6", med <= 0.6),
        Figure("forwarder_latency", "change->outbox p99", round(p99, 3), "s", "<= 1.2", p99 <= 1.2),
    ])
    return 0


def _rows(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
