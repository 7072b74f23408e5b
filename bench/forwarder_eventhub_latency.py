"""IMDS change -> Event Hubs consumer receipt latency, forwarder polling at 1 Hz; and publish
throughput through the real SDK (EventHubSink -> the sandbox server).

    python -m bench.forwarder_eventhub_latency [--changes 30] [--poll-interval 1.0] [--envelopes 2000]

Latency: the IMDS simulator (time scale 1), the sandbox Event Hubs server and the forwarder
(`--sink eventhub`) run as processes; real EventHubConsumerClients (one per partition, so no
partition waits on another) read the hub. For each change the bench schedules an event through the
admin API (the change instant is the midpoint of that POST) and waits for the incarnation envelope
whose document lists it; the receipt instant is when the consumer's callback ran. Changes are spaced
by a random 0.3-1.3 s so they land at every phase of the poll cycle. Goal: median <= 1.0 s,
p99 <= 2.0 s.

Throughput: EventHubSink.send of batches of 100 envelopes (~1.5 KB each, like an incarnation), one
after another, in this process: envelopes/s acknowledged by the hub.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import requests
from azure.eventhub import EventHubConsumerClient

from bench import Figure, median, percentile, record
from forwarder.sinks.eventhub import EventHubSettings, EventHubSink
from sandbox import processes

HUB = "scheduled-events"


class Receipts:
    """EventId -> the first instant a consumer saw an incarnation listing it."""

    def __init__(self, connection_string: str) -> None:
        self.seen: Dict[str, float] = {}
        self._lock = threading.Lock()
        probe = EventHubConsumerClient.from_connection_string(connection_string, consumer_group="$Default")
        try:
            partitions = probe.get_partition_ids()
        finally:
            probe.close()
        self.clients = [EventHubConsumerClient.from_connection_string(connection_string,
                                                                      consumer_group="$Default")
                        for _ in partitions]
        for client, pid in zip(self.clients, partitions):
            threading.Thread(target=client.receive, daemon=True, kwargs={
                "on_event": self._on_event, "partition_id": pid, "starting_position": "-1"}).start()

    def _on_event(self, context: Any, event: Any) -> None:
        at = time.time()
        if event is None:
            return
        envelope = json.loads(event.body_as_str())
        if envelope.get("type") != "scheduledevents.incarnation.v1":
            return
        with self._lock:
            for ev in envelope["data"]["document"].get("Events", []):
                self.seen.setdefault(ev["EventId"], at)

    def get(self, event_id: str) -> Any:
        with self._lock:
            return self.seen.get(event_id)

    def close(self) -> None:
        closers = [threading.Thread(target=c.close, daemon=True) for c in self.clients]
        for t in closers:
            t.start()
        for t in closers:
            t.join(15)


def latency(changes: int, poll_interval: float, work: Path) -> List[float]:
    rng = random.Random()  # spacing only, not security
    session = requests.Session()
    session.trust_env = False
    imds = processes.start_imds(["--time-scale", "1"], log_dir=work)
    hub = processes.start_eventhubs([f"{HUB}=4"], log_dir=work)
    conn = processes.eventhubs_connection_string(hub.port, HUB)
    (work / "config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
    env["SE_FORWARDER_EVENTHUB_CONNECTION_STRING"] = conn
    fw = subprocess.Popen(
        [sys.executable, "-m", "forwarder", "run", "--config", str(work / "config.json"),
         "--imds-url", f"http://{processes.LOOPBACK}:{imds.port}/vms/vm0", "--state-dir", str(work / "state"),
         "--sink", "eventhub", "--poll-interval", str(poll_interval), "--heartbeat-interval", "3600",
         "--log-level", "error"],
        cwd=processes.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    receipts = Receipts(conn)
    admin = f"http://{processes.LOOPBACK}:{imds.port}/admin"
    out: List[float] = []
    try:
        # Warm-up: the first change also waits for the forwarder's first connection to the hub.
        for i in range(changes + 1):
            time.sleep(rng.uniform(0.3, 1.3))
            t0 = time.time()
            resp = session.post(f"{admin}/events", json={"eventType": "Freeze", "noticeSeconds": 900},
                                timeout=10)
            t1 = time.time()
            resp.raise_for_status()
            event_id = resp.json()["eventId"]
            deadline = time.monotonic() + (30 if i == 0 else 15)
            while receipts.get(event_id) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            arrived = receipts.get(event_id)
            if arrived is None:
                raise RuntimeError(f"event {event_id} never reached the consumer")
            if i > 0:
                out.append(arrived - (t0 + t1) / 2)
    finally:
        if fw.poll() is None:
            os.kill(fw.pid, signal.SIGTERM)
            fw.wait(timeout=15)
        receipts.close()
        hub.stop()
        imds.stop()
    return out


def throughput(envelopes: int, work: Path) -> float:
    hub = processes.start_eventhubs(["throughput=4"], log_dir=work)
    sink = EventHubSink(EventHubSettings(connection_string=processes.eventhubs_connection_string(
        hub.port, "throughput")))
    padding = "d" * 1200
    batch = [{"specversion": "1.0", "id": f"vm-t:incarnation:{n}", "type": "scheduledevents.incarnation.v1",
              "partitionkey": "vm-t", "data": {"incarnation": n, "document": padding}} for n in range(100)]
    try:
        sink.send(batch[:1])  # connect first: the figure is the steady state
        started = time.perf_counter()
        sent = 0
        while sent < envelopes:
            sink.send(batch)
            sent += len(batch)
        elapsed = time.perf_counter() - started
    finally:
        sink.close()
        hub.stop()
    return sent / elapsed


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forwarder_eventhub_latency")
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--envelopes", type=int, default=2000, help="for the throughput figure")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rate = throughput(args.envelopes, Path(tmp))
        lat = latency(args.changes, args.poll_interval, Path(tmp))
    med, p99 = median(lat), percentile(lat, 99)
    print(f"publish throughput through the real SDK (EventHubSink, batches of 100): {rate:.0f} envelopes/s")
    print(f"IMDS change -> Event Hubs consumer, polling every {args.poll_interval:g} s, {len(lat)} changes:")
    print(f"  median {med:.3f} s (goal <= 1.0)   p99 {p99:.3f} s (goal <= 2.0)   "
          f"min {min(lat):.3f}   max {max(lat):.3f}")
    name = "forwarder_eventhub_latency"
    record([
        Figure(name, "publish throughput (SDK)", round(rate, 1), "envelopes/s"),
        Figure(name, "change->consumer median", round(med, 3), "s", "<= 1.0", med <= 1.0),
        Figure(name, "change->consumer p99", round(p99, 3), "s", "<= 2.0", p99 <= 2.0),
    ])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
