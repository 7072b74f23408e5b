"""The real `se-forwarder approve` (its own processes, as an operator types it) racing the daemon's queue
reader on one approvals ledger (fcntl lock): the ledger reads back whole, nothing is lost, and no event
is POSTed to IMDS twice. The Windows twin (msvcrt lock, under Wine) is tests/vm_windows."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Dict, List

from forwarder.approvals.ledger import FILE_NAME
from sandbox import processes

from .helpers import Rig, approval

SHARED, CLI_ONLY, QUEUE_ONLY = 4, 4, 4  # events approved by both, by operators only, by the queue only
OPERATORS_PER_SHARED = 2


def _approve(rig: Rig, event_id: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "forwarder", "approve", event_id,
                             "--imds-url", rig.sim.vm_url("vm0"), "--state-dir", str(rig.state_dir),
                             "--hook-dir", str(rig.hook_dir), "--config", str(rig.state_dir / "none.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=processes.minimal_env())


def _feed_the_daemon(rig: Rig, event_ids: List[str], errors: List[BaseException]) -> None:
    """The daemon's side: central's approvals arrive one by one while the operators' processes run."""
    try:
        for event_id in event_ids:
            rig.send(approval(event_id))
            rig.poll()
            time.sleep(0.15)
        deadline = time.monotonic() + 30
        while not rig.queue_empty() and time.monotonic() < deadline:
            rig.poll()
    except BaseException as exc:  # reported by the test thread
        errors.append(exc)


def test_operators_and_the_daemon_racing_on_the_ledger_lose_nothing_and_post_once(rig: Rig) -> None:
    (rig.state_dir / "none.json").write_text("{}")
    events = [rig.sim.add_event(eventType="Redeploy", resources=["vm0"])["eventId"]
              for _ in range(SHARED + CLI_ONLY + QUEUE_ONLY)]
    shared, cli_only = events[:SHARED], events[SHARED:SHARED + CLI_ONLY]
    queue_only = events[SHARED + CLI_ONLY:]
    by_operators = [e for e in shared for _ in range(OPERATORS_PER_SHARED)] + cli_only
    errors: List[BaseException] = []
    daemon = threading.Thread(target=_feed_the_daemon, args=(rig, shared + queue_only, errors))
    operators = {}
    for i, event_id in enumerate(by_operators):
        operators[i] = (event_id, _approve(rig, event_id))
        if i == len(by_operators) // 2:
            daemon.start()  # mid-launch: the daemon's writes land among the operators'
    outs: Dict[int, tuple] = {i: p.communicate(timeout=120) for i, (_, p) in operators.items()}
    daemon.join(60)
    assert not daemon.is_alive() and not errors, errors
    codes = {i: p.returncode for i, (_, p) in operators.items()}
    assert set(codes.values()) <= {0, 7}, {i: (codes[i], outs[i][1]) for i in codes}  # 6: a ledger error

    # an independent reader: the file is whole JSON, every event approved once, by its one POST
    raw = json.loads((rig.state_dir / FILE_NAME).read_text())
    assert not list(rig.state_dir.glob("approvals-ledger.corrupt-*"))
    for event_id in events:
        entry = raw["events"].get(event_id)
        assert entry is not None and entry["state"] == "approved", (event_id, entry)
        posts = [p for p in rig.posts("vm0") if event_id in json.dumps(p)]
        assert len(posts) == 1, (event_id, posts)
    for event_id in cli_only:
        assert raw["events"][event_id]["decidedBy"].startswith("operator:")
    # the daemon recorded every message it handled, and it wrote while operators wrote
    daemon_times = sorted(float(m["t"]) for m in raw["messages"].values())
    assert len(daemon_times) == SHARED + QUEUE_ONLY
    operator_times = [float(v["t"]) for v in raw["events"].values() if v["decidedBy"].startswith("operator:")]
    assert any(min(operator_times) < t < max(operator_times) for t in daemon_times), (
        "no overlap: the daemon wrote before or after every operator", daemon_times, operator_times)
    # one "approved" exit per event at most, among operators and the daemon together
    approved_by_operators = [operators[i][0] for i, c in codes.items() if c == 0]
    for event_id in shared:
        daemon_approved = not raw["events"][event_id]["decidedBy"].startswith("operator:")
        assert approved_by_operators.count(event_id) + daemon_approved >= 1
    print(f"\noperator exits: {sorted(codes.values())}; daemon messages {len(daemon_times)}", flush=True)
