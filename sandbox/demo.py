"""`make demo` (`python -m sandbox.demo`): the simulator and the forwarder as real processes.

Starts the IMDS simulator (time scale 120: a 15-minute notice plays out in 7.5 s) and the forwarder
with the file sink on free loopback ports, schedules a user Reboot and a platform Freeze with their
real minimum notice, prints each incarnation the forwarder published as a timeline, stops
everything by PID, and exits 0 only if every expected step was seen exactly once. Bounded (< 60 s).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import requests

from sandbox import processes

TIME_SCALE = 120.0
DEADLINE_SECONDS = 50.0
WORK = processes.REPO / ".demo" / "forwarder"


def admin(port: int, method: str, path: str, body: Any = None) -> Any:
    session = requests.Session()
    session.trust_env = False
    resp = session.request(method, f"http://{processes.LOOPBACK}:{port}/admin/{path}", json=body, timeout=10)
    resp.raise_for_status()
    return resp.json()


def read(path: Path) -> List[Dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def short(event_id: str) -> str:
    return event_id[:8]


def describe(env: Dict[str, Any], t0: float) -> List[str]:
    """Human-readable lines for one published envelope."""
    data = env["data"]
    when = f"+{_seconds(env['time']) - t0:5.1f}s"
    if env["type"].endswith("quarantined.v1"):
        return [f"{when}  QUARANTINED document: {data['errors'][0]['message']}"]
    if env["type"].endswith("approvalresult.v1"):
        return [f"{when}  approval result for {short(data['eventId'])}: {data['outcome']} ({data['reason']})"]
    if not env["type"].endswith("incarnation.v1"):
        return [f"{when}  {env['type']}"]
    head = f"{when}  incarnation {data['incarnation']:>2}" + ("  (IMDS reset)" if data["reset"] else "")
    lines = [head + ("  nothing scheduled" if not data["document"]["Events"] else "")]
    diff = data["diff"]
    for ev in diff["new"]:
        not_before = ev.get("NotBefore") or "now"
        lines.append(f"           + {_what(ev)} {ev['EventStatus']}, NotBefore {not_before}, "
                     f"Resources {','.join(ev['Resources'])}")
    for ch in diff["changed"]:
        before, after = ch["before"], ch["after"]
        lines.append(f"           ~ {_what(after)} {before['EventStatus']} -> {after['EventStatus']}")
    for ev in diff["gone"]:
        lines.append(f"           - {_what(ev)} gone (completed or cancelled)")
    return lines


def _what(ev: Dict[str, Any]) -> str:
    return f"{ev['EventType']:<8} {ev.get('EventSource', ''):<8} {short(ev['EventId'])}"


def _seconds(stamp: str) -> float:
    from datetime import datetime
    return datetime.strptime(stamp.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def steps_seen(envelopes: List[Dict[str, Any]], event_id: str) -> List[str]:
    """The lifecycle steps of one event as published: scheduled, started, gone."""
    seen = []
    for env in envelopes:
        if not env["type"].endswith("incarnation.v1"):
            continue
        diff = env["data"]["diff"]
        if any(ev["EventId"] == event_id for ev in diff["new"]):
            seen.append("scheduled" if diff["new"][0]["EventStatus"] == "Scheduled" else "started")
        if any(ch["after"]["EventId"] == event_id and ch["after"]["EventStatus"] == "Started"
               for ch in diff["changed"]):
            seen.append("started")
        if any(ev["EventId"] == event_id for ev in diff["gone"]):
            seen.append("gone")
    return seen


def start_forwarder(imds_port: int, sink: Path, log_path: Path) -> subprocess.Popen:
    config = WORK / "config.json"
    config.write_text("{}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
    argv = [sys.executable, "-m", "forwarder", "run", "--config", str(config),
            "--imds-url", f"http://{processes.LOOPBACK}:{imds_port}/vms/vm0",
            "--state-dir", str(WORK / "state"), "--sink", "file", "--sink-file", str(sink),
            "--poll-interval", "1", "--heartbeat-interval", "10"]
    return subprocess.Popen(argv, cwd=processes.REPO, stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "ab"), env=env)


def stop(proc: Optional[subprocess.Popen]) -> Optional[int]:
    if proc is None:
        return None
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            return -9
    return proc.returncode


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    sink = WORK / "published.jsonl"
    started = time.time()
    print(f"IMDS simulator (time scale {TIME_SCALE:g}) and forwarder "
          f"(file sink {sink.relative_to(processes.REPO)})")
    imds = processes.start_imds(["--time-scale", str(TIME_SCALE)], log_dir=WORK)
    forwarder: Optional[subprocess.Popen] = None
    ok = False
    try:
        forwarder = start_forwarder(imds.port, sink, WORK / "forwarder.log")
        deadline = time.monotonic() + DEADLINE_SECONDS
        while not any(e["type"].endswith("incarnation.v1") for e in read(sink)):
            if time.monotonic() > deadline or forwarder.poll() is not None:
                raise RuntimeError(f"the forwarder published nothing; see {WORK / 'forwarder.log'}")
            time.sleep(0.2)
        reboot = admin(imds.port, "POST", "events", {"eventType": "Reboot", "eventSource": "User"})
        reboot = reboot["eventId"]
        print(f"scheduled a user Reboot   {short(reboot)} (15 min notice = {900 / TIME_SCALE:g} s here)")
        time.sleep(2.0)
        freeze = admin(imds.port, "POST", "events", {"eventType": "Freeze", "eventSource": "Platform"})
        freeze = freeze["eventId"]
        print(f"scheduled a platform Freeze {short(freeze)} (15 min notice, 5 s impact)")
        while time.monotonic() < deadline:
            envelopes = read(sink)
            if all("gone" in steps_seen(envelopes, e) for e in (reboot, freeze)):
                break
            if forwarder.poll() is not None:
                break
            time.sleep(0.5)
        time.sleep(1.5)  # a last poll or two: nothing more should appear
        rc = stop(forwarder)
        forwarder = None
        envelopes = read(sink)
        print("\nwhat the forwarder published:")
        for env in envelopes:
            if not env["type"].endswith("heartbeat.v1"):
                for line in describe(env, started):
                    print(line)
        incs = [e for e in envelopes if e["type"].endswith("incarnation.v1")]
        numbers = [e["data"]["incarnation"] for e in incs]
        beats = sum(1 for e in envelopes if e["type"].endswith("heartbeat.v1"))
        print(f"\n{len(incs)} incarnations, {beats} heartbeat(s); forwarder exit code {rc} (SIGTERM)")
        lifecycle = ["scheduled", "started", "gone"]
        checks = {
            "each incarnation published once": len(numbers) == len(set(numbers)),
            "no incarnation skipped": numbers == list(range(numbers[0], numbers[0] + len(numbers))),
            "Reboot: scheduled, started, gone": steps_seen(envelopes, reboot) == lifecycle,
            "Freeze: scheduled, started, gone": steps_seen(envelopes, freeze) == lifecycle,
            "forwarder stopped cleanly": rc == 0,
        }
        for name, passed in checks.items():
            print(f"  [{'ok' if passed else 'FAIL'}] {name}")
        ok = all(checks.values())
    finally:
        stop(forwarder)
        imds.stop()
    print(f"\ndemo {'passed' if ok else 'FAILED'} in {time.time() - started:.1f} s "
          f"(logs in {WORK.relative_to(processes.REPO)})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
