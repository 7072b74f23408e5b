"""The forwarder as a real process (`python -m forwarder run`, file sink) against the IMDS simulator."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import schemas
from sandbox import processes

from .helpers import Forwarder, admin, backlog, imds_url, incarnations, of_type, read_published, wait_until


def schedule(server: processes.Server, **body: Any) -> str:
    body.setdefault("eventType", "Reboot")
    return str(admin(server, "POST", "events", body)["eventId"])


def published_with(path: Path, event_id: str) -> List[Dict[str, Any]]:
    return [e for e in of_type(read_published(path), "incarnation")
            if any(ev["EventId"] == event_id for ev in e["data"]["document"]["Events"])]


def test_each_incarnation_is_published_once_with_its_diff(imds_server: processes.Server,
                                                          tmp_path: Path) -> None:
    sink = tmp_path / "published.jsonl"
    fw = Forwarder(imds_url(imds_server), tmp_path / "state", sink).start()
    try:
        wait_until(lambda: incarnations(sink) == [1], what="incarnation 1")
        # A user Reboot: 120 simulated s of notice (2 s real), Started for 60 (1 s), then gone.
        event_id = schedule(imds_server, eventSource="User", noticeSeconds=120, startedSeconds=60)
        wait_until(lambda: len(incarnations(sink)) >= 4, timeout=30, what="incarnations 2..4")
        time.sleep(1.0)  # a few more polls: nothing new may appear
        assert fw.alive()
    finally:
        rc = fw.terminate()
    assert rc == 0  # SIGTERM: a clean stop
    envelopes = read_published(sink)
    for env in envelopes:
        assert schemas.errors("envelope.schema.json", env) == [], env
    incs = of_type(envelopes, "incarnation")
    assert [e["data"]["incarnation"] for e in incs] == [1, 2, 3, 4]
    assert len({e["id"] for e in incs}) == 4
    new, started, gone = (e["data"]["diff"] for e in incs[1:])
    assert [ev["EventId"] for ev in new["new"]] == [event_id]
    assert started["changed"][0]["after"]["EventStatus"] == "Started"
    assert [ev["EventId"] for ev in gone["gone"]] == [event_id]
    assert [e["data"]["previousIncarnation"] for e in incs] == [None, 1, 2, 3]
    assert of_type(envelopes, "heartbeat"), "the first heartbeat goes out once the identity is known"
    assert any(line.get("msg") == "stopped" for line in fw.logs())
    assert backlog(tmp_path / "state") == 0


def test_sigkill_then_restart_loses_nothing_and_republishes_nothing_acked(
        imds_server: processes.Server, tmp_path: Path) -> None:
    state, sink = tmp_path / "state", tmp_path / "published.jsonl"
    url = imds_url(imds_server)
    fw = Forwarder(url, state, sink).start()
    wait_until(lambda: incarnations(sink) == [1], what="incarnation 1")
    event_id = schedule(imds_server, noticeSeconds=900)
    wait_until(lambda: published_with(sink, event_id), what="the scheduled event")
    wait_until(lambda: backlog(state) == 0, what="an empty outbox (everything acknowledged)")
    fw.kill()
    admin(imds_server, "POST", f"events/{event_id}/cancel")  # a change while the forwarder is down
    fw2 = Forwarder(url, state, sink).start()
    wait_until(lambda: len(incarnations(sink)) >= 3, what="the change made while down")
    # (acknowledged before the kill: one written but not yet acknowledged is rightly sent again)
    wait_until(lambda: backlog(state) == 0, what="the change acknowledged")
    # Now a crash with envelopes pending: the sink fails (its parent is a file), then SIGKILL.
    fw2.kill()
    blocker = tmp_path / "blocked"
    blocker.write_text("not a directory")
    fw3 = Forwarder(url, state, blocker / "published.jsonl").start()
    second = schedule(imds_server, noticeSeconds=900)
    wait_until(lambda: backlog(state) >= 1, what="a pending envelope while the sink fails")
    wait_until(lambda: any("send failed" in str(line.get("msg")) for line in fw3.logs()),
               what="the failed send logged")
    fw3.kill()
    fw4 = Forwarder(url, state, sink).start()
    try:
        wait_until(lambda: published_with(sink, second), what="the pending envelope after restart")
        assert fw4.alive()
    finally:
        assert fw4.terminate() == 0
    incs = of_type(read_published(sink), "incarnation")
    numbers = [e["data"]["incarnation"] for e in incs]
    assert numbers == sorted(numbers) and numbers[:2] == [1, 2]
    assert len(numbers) == len(set(numbers)), f"an acknowledged incarnation was republished: {numbers}"
    assert set(numbers) == set(range(1, max(numbers) + 1)), f"an incarnation was skipped: {numbers}"
    assert incs[2]["data"]["previousIncarnation"] == 2
    assert [ev["EventId"] for ev in incs[2]["data"]["diff"]["gone"]] == [event_id]


def test_every_fault_kind_is_survived_and_the_next_incarnation_published(
        imds_server: processes.Server, tmp_path: Path) -> None:
    sink = tmp_path / "published.jsonl"
    fw = Forwarder(imds_url(imds_server), tmp_path / "state", sink).start()
    faults = [
        {"kind": "status", "status": 500, "count": 3},
        {"kind": "status", "status": 410, "count": 3},
        {"kind": "status", "status": 429, "count": 6},
        {"kind": "status", "status": 503, "count": 2},
        {"kind": "slow", "seconds": 6, "count": 1},
        {"kind": "malformed", "count": 3},
        {"kind": "invalid", "count": 3},
        {"kind": "reset"},
    ]
    try:
        wait_until(lambda: incarnations(sink) == [1], what="incarnation 1")
        for fault in faults:
            admin(imds_server, "POST", "faults", fault)
            time.sleep(0.6)  # let a poll or two meet the fault
            event_id = schedule(imds_server, eventType="Freeze", noticeSeconds=900)
            wait_until(lambda eid=event_id: published_with(sink, eid), timeout=30,
                       what=f"the incarnation after fault {fault}")
            assert fw.alive(), f"the forwarder died on {fault}"
        answered = {r["status"] for r in admin(imds_server, "GET", "requests?vm=vm0&path=scheduledevents")}
        assert {500, 410, 429, 503} <= answered, f"not every fault reached the forwarder: {answered}"
    finally:
        assert fw.terminate() == 0
    envelopes = read_published(sink)
    quarantined = of_type(envelopes, "quarantined")
    assert quarantined, "malformed and invalid documents must be forwarded as quarantined"
    assert len({q["data"]["rawSha256"] for q in quarantined}) == len(quarantined)  # same body: once
    malformed = [q for q in quarantined if q["data"]["document"] is None]
    invalid = [q for q in quarantined if q["data"]["document"] is not None]
    assert malformed and "not JSON" in malformed[0]["data"]["errors"][0]["message"]
    assert invalid and any("/Events" in e["path"] for e in invalid[0]["data"]["errors"])
    resets = [e for e in of_type(envelopes, "incarnation") if e["data"]["reset"]]
    assert resets, "the lowered incarnation must be published, flagged reset"
    assert resets[0]["data"]["incarnation"] < resets[0]["data"]["previousIncarnation"]
    warnings = [line for line in fw.logs() if line.get("level") == "warning"]
    assert warnings  # faults were seen and logged, not silently absorbed


def run_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.json"
    config.write_text("{}")
    return subprocess.run([sys.executable, "-m", "forwarder", "check", "--json", "--config", str(config),
                           *args], capture_output=True, text=True, timeout=60, cwd=processes.REPO,
                          env=processes.minimal_env(**DEAD_PROXY))


# If the CLI ever honoured these, every IMDS call would fail and `check` would exit 3, not 0.
DEAD_PROXY = {name: f"http://127.0.0.1:{processes.free_port()}"
              for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")}


def test_check_exit_codes(imds_server: processes.Server, tmp_path: Path) -> None:
    url = imds_url(imds_server)
    ok = run_check(tmp_path, "--imds-url", url, "--state-dir", str(tmp_path))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert '"valid": true' in ok.stdout and '"name": "vm0"' in ok.stdout
    admin(imds_server, "POST", "faults", {"kind": "invalid", "count": 1})
    invalid = run_check(tmp_path, "--imds-url", url, "--state-dir", str(tmp_path))
    assert invalid.returncode == 5 and '"valid": false' in invalid.stdout
    refused = run_check(tmp_path, "--imds-url", url + "/not-imds", "--state-dir", str(tmp_path))
    assert refused.returncode == 4 and "HTTP 404" in refused.stdout
    unknown_version = run_check(tmp_path, "--imds-url", url, "--api-version", "2015-01-01")
    assert unknown_version.returncode == 2 and "api_version '2015-01-01'" in unknown_version.stderr
    down = run_check(tmp_path, "--imds-url", f"http://127.0.0.1:{processes.free_port()}",
                     "--state-dir", str(tmp_path))
    assert down.returncode == 3 and '"answered": false' in down.stdout
    bad = run_check(tmp_path, "--poll-interval", "-1")
    assert bad.returncode == 2 and "poll_interval" in bad.stderr


def test_run_exits_6_when_the_state_dir_is_unusable(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    config = tmp_path / "config.json"
    config.write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "forwarder", "run", "--config", str(config),
                           "--state-dir", str(not_a_dir / "state"), "--imds-url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=30, cwd=processes.REPO)
    assert proc.returncode == 6 and "--state-dir" in proc.stderr


def test_sigint_also_stops_cleanly(imds_server: processes.Server, tmp_path: Path) -> None:
    sink = tmp_path / "published.jsonl"
    fw = Forwarder(imds_url(imds_server), tmp_path / "state", sink).start()
    wait_until(lambda: incarnations(sink) == [1], what="incarnation 1")
    assert fw.proc is not None
    fw.proc.send_signal(signal.SIGINT)
    assert fw.proc.wait(timeout=15) == 0
