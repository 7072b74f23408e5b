"""The real `se-forwarder approve` (its own processes, as an operator types it) racing the daemon's queue
reader on one approvals ledger (fcntl lock): the ledger reads back whole, nothing is lost, and no event
is POSTed to IMDS twice. The Windows twin (msvcrt lock, under Wine) is tests/vm_windows."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, List

import pytest

from forwarder.approvals.ledger import FILE_NAME
from sandbox import processes

from .helpers import TIME_SCALE, VM0, Rig, approval

SHARED, CLI_ONLY, QUEUE_ONLY = 4, 4, 4  # events approved by both, by operators only, by the queue only
OPERATORS_PER_SHARED = 2
LAUNCH_GAP = 0.25  # seconds between operators: their writes span the daemon's (measured: ~3 s each)


@pytest.fixture(scope="module")
def imds_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    """This module's simulator (overrides conftest's): IMDS's 5 requests/s per VM would throttle a crowd
    of twelve operators into exit 3 ("retry later"), which is not what the race is about."""
    args = ["--time-scale", TIME_SCALE, "--rate-limit", "0", "--vm", json.dumps(VM0)]
    server = processes.start_imds(args, log_dir=tmp_path_factory.mktemp("imds"))
    yield server
    server.stop()


def _approve(rig: Rig, event_id: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "forwarder", "approve", event_id,
                             "--imds-url", rig.sim.vm_url("vm0"), "--state-dir", str(rig.state_dir),
                             "--hook-dir", str(rig.hook_dir), "--config", str(rig.state_dir / "none.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=processes.minimal_env())


def _ledger(rig: Rig) -> Dict[str, Dict[str, Any]]:
    path = rig.state_dir / FILE_NAME
    return json.loads(path.read_text()) if path.exists() else {"events": {}, "messages": {}}


def _messages(rig: Rig) -> Dict[str, Any]:
    return _ledger(rig)["messages"]


def _feed_the_daemon(rig: Rig, event_ids: List[str], errors: List[BaseException]) -> None:
    """The daemon's side: central's approvals arrive one by one while the operators' processes run."""
    try:
        deadline = time.monotonic() + 60  # starts once the first operator wrote: their writes interleave
        while time.monotonic() < deadline and not any(
                str(e.get("decidedBy", "")).startswith("operator:") for e in _ledger(rig)["events"].values()):
            time.sleep(0.05)
        for event_id in event_ids:
            rig.send(approval(event_id))
            rig.poll()
            time.sleep(0.15)
        # until it recorded every message (a message may wait for a later poll while operators hold the lock)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_messages(rig)) < len(event_ids):
            rig.poll()
            time.sleep(0.3)
    except BaseException as exc:  # reported by the test thread
        errors.append(exc)


def test_operators_and_the_daemon_racing_on_the_ledger_lose_nothing_and_post_once(rig: Rig) -> None:
    (rig.state_dir / "none.json").write_text("{}")
    # an hour of notice (a minute here): none starts by itself at NotBefore during the race
    events = [rig.sim.add_event(eventType="Redeploy", resources=["vm0"], noticeSeconds=3600)["eventId"]
              for _ in range(SHARED + CLI_ONLY + QUEUE_ONLY)]
    shared, cli_only = events[:SHARED], events[SHARED:SHARED + CLI_ONLY]
    queue_only = events[SHARED + CLI_ONLY:]
    by_operators = [e for e in shared for _ in range(OPERATORS_PER_SHARED)] + cli_only
    errors: List[BaseException] = []
    daemon = threading.Thread(target=_feed_the_daemon, args=(rig, shared + queue_only, errors))
    operators = {}
    daemon.start()  # it waits for the first operator's write
    for i, event_id in enumerate(by_operators):
        operators[i] = (event_id, _approve(rig, event_id))
        if by_operators[i + 1:i + 2] != [event_id]:  # the operators of one event start together
            time.sleep(LAUNCH_GAP)
    outs: Dict[int, tuple] = {i: p.communicate(timeout=120) for i, (_, p) in operators.items()}
    daemon.join(150)
    assert not daemon.is_alive() and not errors, errors
    codes = {i: p.returncode for i, (_, p) in operators.items()}
    assert set(codes.values()) <= {0, 7}, {i: (codes[i], outs[i][1]) for i in codes}  # 6: a ledger error

    # an independent reader: the file is whole JSON, every event approved once, by its one POST
    raw = json.loads((rig.state_dir / FILE_NAME).read_text())
    assert not list(rig.state_dir.glob("approvals-ledger.corrupt-*"))
    for event_id in events:
        entry = raw["events"].get(event_id)
        assert entry is not None and entry["state"] == "approved", (event_id, entry, [
            (codes[i], outs[i][1][-600:]) for i, (e, _) in operators.items() if e == event_id])
        posts = [p for p in rig.posts("vm0") if event_id in json.dumps(p) and p["status"] == 200]
        assert len(posts) == 1, (event_id, [(p["t"], p.get("status"), sorted(p)) for p in posts])
    for event_id in cli_only:
        assert raw["events"][event_id]["decidedBy"].startswith("operator:")
    # the daemon recorded every message it handled, and it wrote while operators wrote
    daemon_times = sorted(float(m["t"]) for m in raw["messages"].values())
    assert len(daemon_times) == SHARED + QUEUE_ONLY
    operator_times = [float(v["t"]) for v in raw["events"].values() if v["decidedBy"].startswith("operator:")]
    overlap = [t for t in daemon_times if min(operator_times) < t < max(operator_times)]
    assert overlap, ("no overlap: the daemon wrote before or after every operator", daemon_times,
                     operator_times)
    # every shared event is reported approved by at least one side; more than one may say so (a loser that
    # found the winner's "pending" entry reports what IMDS shows, docs/approvals.md): the POSTs, counted
    # above, are what must be one
    approved_by_operators = [operators[i][0] for i, c in codes.items() if c == 0]
    for event_id in shared:
        daemon_approved = not raw["events"][event_id]["decidedBy"].startswith("operator:")
        assert approved_by_operators.count(event_id) + daemon_approved >= 1
    print(f"\noperator exits: {sorted(codes.values())}; daemon messages {len(daemon_times)}, "
          f"{len(overlap)} written among the operators' writes", flush=True)

