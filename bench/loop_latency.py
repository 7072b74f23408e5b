"""The whole loop at production pace: IMDS change -> Event Hubs consumer receipt, and event appears in
IMDS -> approval POST received by IMDS (through central), each median and p99.

    python -m bench.loop_latency [--changes 15] [--poll-interval 1.0]

Real processes: the IMDS simulator (time scale 1), the sandbox Event Hubs server, Azurite, central
(function_app.py in the Functions runner, default policy), and `se-forwarder run` with the Event Hubs
sink and its approval queue (poll 1 s, fast queue interval 2 s). A real `EventHubConsumerClient`
(own consumer group) timestamps each incarnation's arrival. Each change is a user-initiated Reboot
(the default policy approves it at once); the change instant is the midpoint of the admin POST; the
POST instant is the simulator's request-log time. Changes are spaced by a random 0.3-1.3 s after the
previous event is gone, so they land at every phase of the poll cycle.
Goals: consumer receipt median <= 1.0 s, p99 <= 2.0 s (issue 3); approval loop median <= 3 s,
p99 <= 6 s (issue 5).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import requests

from bench import Figure, median, percentile, record
from sandbox import processes
from tests.forwarder_eventhubs.helpers import Consumer
from tests.functions.conftest import RunnerFiles, start_runner

HUB = "scheduled-events"


class TimedConsumer(Consumer):
    """The tests' per-partition consumer, plus the arrival time of each incarnation's events."""

    def __init__(self, connection_string: str) -> None:
        super().__init__(connection_string)
        self.arrivals: Dict[str, float] = {}  # EventId -> first arrival (epoch seconds)

    def _on_event(self, context: Any, event: Any) -> None:
        at = time.time()
        super()._on_event(context, event)
        if event is None:
            return
        env = json.loads(event.body_as_str())
        if env.get("type") == "scheduledevents.incarnation.v1":
            for e in env["data"]["document"].get("Events", []):
                self.arrivals.setdefault(e["EventId"], at)


def admin(port: int, method: str, path: str, body: Any = None) -> Any:
    resp = requests.request(method, f"http://127.0.0.1:{port}/admin/{path}", json=body, timeout=10)
    resp.raise_for_status()
    return resp.json() if resp.text else None


def wait(predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    return None


def post_time(port: int, event_id: str) -> Optional[float]:
    for r in admin(port, "GET", "requests?method=POST&path=scheduledevents"):
        if event_id in (r.get("body") or ""):
            return float(r["t"])
    return None


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loop_latency")
    parser.add_argument("--changes", type=int, default=15)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    rng = random.Random(3)
    consumer_lat: List[float] = []
    loop_lat: List[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        imds = processes.start_imds(["--time-scale", "1"], log_dir=work)
        hub = processes.start_eventhubs([f"{HUB}=4"], log_dir=work)
        azurite = processes.start_azurite(log_dir=work)
        storage = azurite.extra["connection_string"]
        conn = processes.eventhubs_connection_string(hub.port, HUB)
        files = RunnerFiles(work / "central")
        files.write({"AzureWebJobsStorage": storage, "ApprovalStorage": storage, "EventHubConnection": conn,
                     "EVENTHUB_NAME": HUB, "EVENTHUB_CONSUMER_GROUP": "central", "TABLE_PREFIX": "loop",
                     "POLICY_JSON": "", "ALERT_WEBHOOK_URL": "", "ALERT_WEBHOOK_FORMAT": "generic",
                     "REEVALUATE_SCHEDULE": "*/5 * * * * *"})
        central = start_runner(files, "function_app")
        (work / "config.json").write_text("{}")
        hooks = work / "hooks"
        hooks.mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
        env.update({"SE_FORWARDER_EVENTHUB_CONNECTION_STRING": conn,
                    "SE_FORWARDER_QUEUE_CONNECTION_STRING": storage})
        fw_log = open(work / "forwarder.log", "wb")  # closed in the finally below
        fw = subprocess.Popen(
            [sys.executable, "-m", "forwarder", "run", "--config", str(work / "config.json"),
             "--imds-url", f"http://127.0.0.1:{imds.port}/vms/vm0", "--state-dir", str(work / "state"),
             "--sink", "eventhub", "--poll-interval", str(args.poll_interval), "--hook-dir", str(hooks),
             "--log-level", "warning"],
            cwd=processes.REPO, env=env, stdout=subprocess.DEVNULL, stderr=fw_log)
        consumer = TimedConsumer(conn).start()
        try:
            # Central must know the VM (its first incarnation / heartbeat) before it can elect it leader.
            time.sleep(8.0)
            for _ in range(args.changes):
                time.sleep(rng.uniform(0.3, 1.3))
                before = time.time()
                event = admin(imds.port, "POST", "events", {"eventType": "Reboot", "eventSource": "User",
                                                            "resources": ["vm0"], "noticeSeconds": 900,
                                                            "startedSeconds": 1})
                changed = (before + time.time()) / 2
                eid = event["eventId"]
                got = wait(lambda eid=eid: consumer.arrivals.get(eid), 30)
                posted = wait(lambda eid=eid: post_time(imds.port, eid), 60)
                if got is None or posted is None:
                    print(f"event {eid}: consumer {got}, POST {posted}: not seen in time", file=sys.stderr)
                    continue
                consumer_lat.append(got - changed)
                loop_lat.append(posted - changed)
                wait(lambda: not admin(imds.port, "GET", "vms/vm0/document")["Events"], 30)
        finally:
            consumer.close()
            if fw.poll() is None:
                fw.terminate()
                try:
                    fw.wait(15)
                except subprocess.TimeoutExpired:
                    fw.kill()
            fw_log.close()
            central.stop()
            azurite.stop()
            hub.stop()
            imds.stop()
    if not consumer_lat:
        print("no change completed the loop", file=sys.stderr)
        return 1
    c_med, c_p99 = median(consumer_lat), percentile(consumer_lat, 99)
    l_med, l_p99 = median(loop_lat), percentile(loop_lat, 99)
    print(f"IMDS change -> consumer receipt, n={len(consumer_lat)}: median {c_med:.3f} s, p99 {c_p99:.3f} s")
    print(f"event appears -> approval POST (via central), n={len(loop_lat)}: median {l_med:.3f} s, "
          f"p99 {l_p99:.3f} s")
    record([
        Figure("loop_latency", "change->consumer median", round(c_med, 3), "s", "<= 1.0", c_med <= 1.0),
        Figure("loop_latency", "change->consumer p99", round(c_p99, 3), "s", "<= 2.0", c_p99 <= 2.0),
        Figure("loop_latency", "event->approval POST median (via central)", round(l_med, 3), "s", "<= 3",
               l_med <= 3.0),
        Figure("loop_latency", "event->approval POST p99 (via central)", round(l_p99, 3), "s", "<= 6",
               l_p99 <= 6.0),
        Figure("loop_latency", "changes measured", len(consumer_lat), "", f"{args.changes}",
               len(consumer_lat) == args.changes),
    ])
    return 0 if len(consumer_lat) == args.changes else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
