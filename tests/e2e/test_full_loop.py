"""The full loop, end to end: `python -m sandbox.demo` (every real process) exits 0, and its evidence
(the simulator's request log and events, central's tables, the alerts as delivered, the hook's record)
shows each event approved exactly once by the expected VM, in the expected way.

One demo run serves every assertion (it takes ~45 s); a second test interrupts a run and checks no
child process survives. The fresh-install demo is in this file too: demos share the machine's two
cores, and pytest-xdist (`--dist loadfile`) keeps one file's tests on one worker, so no two demos start
at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from central.store.tables import get_json
from sandbox import processes
from tests.e2e.checkout import (
    alive,
    checkout_view,
    descendants,
    make_args,
    readme_commands,
    run_to_end,
    typed,
)

RUN_TIMEOUT = 180  # the demo bounds itself well below this (~45-70 s alone; more beside other suites)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root the README's commands are typed in (tests/e2e/checkout.py)."""
    return checkout_view(tmp_path_factory.mktemp("checkout") / "repo")


@pytest.fixture(scope="module")
def demo(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """`make demo DEMO_ARGS=--capture` as the README has it, from the checkout's root (work folder `.demo`,
    relative, as the Makefile leaves it), plus --evidence for these tests and --no-witness (the second act
    is tests/e2e/test_witness_act.py's)."""
    evidence = tmp_path_factory.mktemp("demo") / "evidence.json"
    argv = make_args("demo", [readme_demo_args("--capture"), "--no-witness", f"--evidence {evidence}"])
    proc = run_to_end(argv, checkout, RUN_TIMEOUT)
    doc = json.loads(evidence.read_text()) if evidence.exists() else {}
    yield {"rc": proc.returncode, "out": proc.stdout + proc.stderr, "work": checkout / ".demo", **doc}


def readme_demo_args(args: str) -> str:
    """DEMO_ARGS of the README's `make demo DEMO_ARGS=...` line that has `args` (fails when it is gone)."""
    line = next(c for c in readme_commands() if c == f"make demo DEMO_ARGS={args}")
    return line.split("DEMO_ARGS=", 1)[1]


def _scene(demo: Dict[str, Any], key: str) -> Dict[str, Any]:
    return next(s for s in demo["scenes"] if s["key"] == key)


def _posts(demo: Dict[str, Any], event_id: str) -> List[Dict[str, Any]]:
    return [p for p in demo["evidence"]["posts"]
            if event_id in [r["EventId"] for r in json.loads(p["body"])["StartRequests"]]]


def _event_row(demo: Dict[str, Any], event_id: str) -> Dict[str, Any]:
    rows = [r for r in demo["evidence"]["tables"]["Events"] if r["EventId"] == event_id]
    assert len(rows) == 1, rows
    return rows[0]


def _results(demo: Dict[str, Any], event_id: str, outcome: str) -> List[Dict[str, Any]]:
    return [r for r in demo["evidence"]["tables"]["Decisions"]
            if r["EventId"] == event_id and r["Action"] == "result" and r["State"] == outcome]


def _hooks(demo: Dict[str, Any], event_id: str) -> List[Dict[str, Any]]:
    return [h for h in demo["evidence"]["hooks"] if h["eventId"] == event_id]


def test_demo_exits_0_with_every_check_passed(demo: Dict[str, Any]) -> None:
    assert demo["rc"] == 0, demo["out"][-6000:]
    assert demo["checks"] and all(c["ok"] for c in demo["checks"]), [c for c in demo["checks"] if not c["ok"]]
    assert "demo passed" in demo["out"]


def test_the_freeze_is_approved_exactly_once_by_the_leader(demo: Dict[str, Any]) -> None:
    freeze = _scene(demo, "b")
    assert freeze["spec"]["resources"] == ["vm-b", "vm-c"]
    posts = _posts(demo, freeze["eventId"])
    assert [(p["vm"], p["status"]) for p in posts] == [("vm-b", 200)]  # one POST, the leader's
    sim = demo["evidence"]["sim_events"][freeze["eventId"]]
    assert sim["audience"] == ["vm-b", "vm-c"] and sim["approvedBy"] == ["vm-b"]
    row = _event_row(demo, freeze["eventId"])
    assert row["LeaderVmName"] == "vm-b" and row["ApprovalCount"] == 1
    assert set(get_json(row, "ReportedBy", {})) == {"vm-b", "vm-c"}  # both VMs reported it
    assert [r["LeaderVmName"] for r in _results(demo, freeze["eventId"], "approved")] == ["vm-b"]


def test_the_user_reboot_is_approved_at_once(demo: Dict[str, Any]) -> None:
    reboot = _scene(demo, "a")
    assert [(p["vm"], p["status"]) for p in _posts(demo, reboot["eventId"])] == [("vm-a", 200)]
    approvals = get_json(_event_row(demo, reboot["eventId"]), "Approvals", [])
    assert [(a["vmName"], a["action"], a["decidedBy"]) for a in approvals] == [
        ("vm-a", "approve", "policy:default:user-initiated")]
    assert not _hooks(demo, reboot["eventId"])


def test_the_redeploy_is_approved_only_after_the_drain_hook(demo: Dict[str, Any]) -> None:
    redeploy = _scene(demo, "c")
    (post,) = _posts(demo, redeploy["eventId"])
    assert post["vm"] == "vm-a" and post["status"] == 200
    runs = _hooks(demo, redeploy["eventId"])
    assert [(h["vm"], h["what"]) for h in runs] == [("vm-a", "start"), ("vm-a", "end")]
    assert runs[0]["decidedBy"] == "policy:drain-before-redeploy"
    assert runs[1]["t"] <= post["t"]  # drained, then approved
    approvals = get_json(_event_row(demo, redeploy["eventId"]), "Approvals", [])
    assert [(a["vmName"], a["action"]) for a in approvals] == [("vm-a", "hook-then-approve")]


def test_the_preempt_is_approved_locally(demo: Dict[str, Any]) -> None:
    preempt = _scene(demo, "d")
    (post,) = _posts(demo, preempt["eventId"])
    assert post["vm"] == "vm-c" and post["status"] == 200
    row = _event_row(demo, preempt["eventId"])
    assert get_json(row, "Approvals", []) == []  # central held it; nothing was sent
    assert [(r["LeaderVmName"], r["DecidedBy"]) for r in _results(demo, preempt["eventId"], "approved")] == [
        ("vm-c", "vm:vm-c (local:fastpath)")]
    runs = _hooks(demo, preempt["eventId"])
    assert [(h["vm"], h["what"]) for h in runs] == [("vm-c", "start"), ("vm-c", "end")]
    assert runs[1]["t"] <= post["t"]


# what the default STATUS_ALERT_MIN_SEVERITY (warning) posts per scene: an info rule's event nothing, a
# warning rule's its Scheduled alert; an approved start and the end are info. The Preempt's start is posted
# when it reaches central before the VM's fast-path result (the two envelopes race).
POSTED = {"a": [[]], "b": [[]], "c": [["Scheduled"]], "d": [["Scheduled"], ["Scheduled", "Started"]]}


def test_every_event_started_and_ended_and_only_its_news_was_posted(demo: Dict[str, Any]) -> None:
    alerts = [a["body"] for a in demo["evidence"]["alerts"]]
    assert all(n == 1 for n in Counter(a["key"] for a in alerts).values())  # none delivered twice
    for scene in demo["scenes"]:
        event_id = scene["eventId"]
        sim = demo["evidence"]["sim_events"][event_id]
        assert sim["state"] == "Completed" and sim["startedAt"] and sim["goneAt"]
        row = _event_row(demo, event_id)
        assert row["Status"] == "Completed" and row["EverStarted"] is True
        # the record keeps every status, posted or not
        assert [h["status"] for h in json.loads(row["History"])] == ["Scheduled", "Started", "Completed"]
        statuses = sorted(a["status"] for a in alerts if a.get("eventId") == event_id)
        assert statuses in POSTED[scene["key"]], (scene["key"], statuses)
        assert all(a["severity"] != "info" for a in alerts if a.get("eventId") == event_id)
    assert not [a for a in alerts if a["kind"] != "event-status"]


def test_no_duplicate_rows(demo: Dict[str, Any]) -> None:
    tables = demo["evidence"]["tables"]
    incs = Counter((r["VmId"], r["Incarnation"]) for r in tables["Incarnations"])
    assert incs and all(n == 1 for n in incs.values())
    results = Counter((r["EventId"], r["LeaderVmName"], r["State"])
                      for r in tables["Decisions"] if r["Action"] == "result")
    assert results and all(n == 1 for n in results.values()), results
    assert len({r["EventId"] for r in tables["Events"]}) == len(tables["Events"]) == 4


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to list child processes")
def test_an_interrupted_demo_stops_every_process(tmp_path: Path) -> None:
    # Ctrl-C as in a terminal: SIGINT at its default in the demo, even when pytest itself was started in
    # the background (a shell starts background jobs with SIGINT ignored, and children inherit that)
    proc = subprocess.Popen([sys.executable, "-m", "sandbox.demo", "--work", str(tmp_path / "work")],
                            cwd=processes.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        line = ""
        seen = []
        while time.monotonic() < deadline and "scene a" not in line:
            line = proc.stdout.readline()
            seen.append(line)
            assert line, "the demo ended before its first scene:\n" + "".join(seen)[-4000:]
        children = descendants(proc.pid)
        assert len(children) >= 8  # azurite, eventhubs, imds, webhook, functions, 3 forwarders
        os.kill(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 130, rest
    assert "every process was stopped" in rest
    assert [pid for pid in children if alive(pid)] == []


def test_the_checks_catch_a_second_approval_and_a_missing_alert(demo: Dict[str, Any]) -> None:
    """The demo's verdict can fail: the same evidence with one more Freeze POST (from vm-c) and the
    Reboot's Started alert lost is reported, per scene, with what was seen."""
    from sandbox.demo.scenario import Evidence, Scene, check, scenes

    plan: List[Scene] = scenes()
    for scene in plan:
        scene.event_id = _scene(demo, scene.key)["eventId"]
    ev = Evidence(**demo["evidence"])
    assert all(c.ok for c in check(plan, ev))
    freeze, redeploy = plan[1].event_id, plan[2].event_id
    ev.posts.append({**_posts(demo, freeze)[0], "vm": "vm-c"})
    ev.alerts = [a for a in ev.alerts if a["body"].get("key") != f"{redeploy}:Scheduled"]
    failed = {(c.scene, c.what.split(",")[0].split(" (")[0]) for c in check(plan, ev) if not c.ok}
    assert failed == {("b", "approved exactly once"), ("c", "one alert per status posted by default")}


def test_the_demo_leaves_capture_files_and_their_analysis(demo: Dict[str, Any]) -> None:
    """`python -m sandbox.demo --capture`: Capture files in <work>/capture in Azure's layout, read by the
    example analysis (examples/analysis) into a table and a PNG."""
    import re

    work: Path = demo["work"]
    files = sorted(p.relative_to(work / "capture").as_posix() for p in (work / "capture").rglob("*.avro"))
    assert files, demo["out"][-2000:]
    layout = re.compile(r"^sandbox/scheduled-events/[0-3]/\d{4}/\d{2}/\d{2}/\d{2}/\d{2}/\d{2}\.avro$")
    assert all(layout.match(name) for name in files), files
    png = (work / "analysis" / "summary.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (work / "analysis" / "summary.md").read_text()
    notice = table.split("## Approval lead")[0]
    for event_type in ("Reboot", "Redeploy", "Preempt"):  # one scene each
        assert f"| {event_type} | 1 |" in notice, table
    assert "| Freeze | 2 |" in notice, table  # scene b and the signed-in operators' scene (operators.py)
    assert "| db |" in table and "| web |" in table  # the fleet's role tags
    assert "0 unreadable, 0 invalid" in demo["out"]


def test_the_readmes_policy_commands_run_as_typed_on_the_demos_capture(demo: Dict[str, Any],
                                                                       checkout: Path) -> None:
    """The README's `se-policy check` and `se-policy whatif ... --from .demo/envelopes.jsonl`, typed in the
    checkout's root right after `make demo DEMO_ARGS=--capture` (relative paths, the venv's scripts)."""
    check = next(c for c in readme_commands() if c.startswith(".venv/bin/se-policy check "))
    out = typed(checkout, check, timeout=60)
    assert out.returncode == 0, (check, out.stdout, out.stderr)
    valid = "schemas/examples/policy/windows-and-budgets.json: valid: 0 error(s)"
    assert out.stdout.startswith(valid), out.stdout
    whatif = next(c for c in readme_commands() if c.startswith(".venv/bin/se-policy whatif "))
    assert ".demo/envelopes.jsonl" in whatif
    out = typed(checkout, whatif, timeout=120)
    assert out.returncode == 0, (whatif, out.stdout, out.stderr)
    replayed = [e["eventId"] for e in demo["scenes"]]
    assert replayed and all(e[:8] in out.stdout for e in replayed), out.stdout


def test_every_readme_command_is_run_by_a_test() -> None:
    """The README's shell blocks hold exactly the commands these tests type: each `make demo DEMO_ARGS=...`
    line as typed (plus --evidence, and --no-witness for the first act, whose second act
    test_witness_act.py plays in process), `make sandbox`, both se-policy lines; plain `make demo` is run as
    those two acts, not as one command, and `make test` is CI's own run."""
    assert readme_commands() == [
        "make demo", "make test", "make demo DEMO_ARGS=--fresh-install", "make sandbox",
        ".venv/bin/se-policy check schemas/examples/policy/windows-and-budgets.json",
        "make demo DEMO_ARGS=--capture",
        ".venv/bin/se-policy whatif schemas/examples/policy/windows-and-budgets.json"
        " --from .demo/envelopes.jsonl",
    ], "a README command changed: type the new one in tests/e2e (test_full_loop, test_practice_fleet)"


# ---- the fresh install (issue 11) --------------------------------------------------------------
# A fresh install is quiet and correct (issue 11): `python -m sandbox.demo --fresh-install` runs every real
# process with the built-in default policy (no POLICY_JSON), forwarders on their default approval settings
# and only the install's *.example hooks. A platform Reboot, a Redeploy and a 30 s Freeze are each
# `default:impactful` (approve-after-hook): each must be approved once by its VM, plainly, with the result
# saying no hook was installed, and no critical alert may fire.

@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """`make demo DEMO_ARGS=--fresh-install`, as the README has it, from a checkout's root (its own, so the
    first demo's `.demo` stays for the tests that read it)."""
    evidence = tmp_path_factory.mktemp("fresh") / "evidence.json"
    checkout = checkout_view(evidence.parent / "repo")
    argv = make_args("demo", [readme_demo_args("--fresh-install"), f"--evidence {evidence}"])
    proc = run_to_end(argv, checkout, RUN_TIMEOUT)
    doc = json.loads(evidence.read_text()) if evidence.exists() else {}
    yield {"rc": proc.returncode, "out": proc.stdout + proc.stderr, "work": checkout / ".demo", **doc}


def _decisions(fresh: Dict[str, Any], event_id: str) -> List[Dict[str, Any]]:
    return [r for r in fresh["evidence"]["tables"]["Decisions"] if r["EventId"] == event_id]


def test_the_fresh_install_demo_passes_every_check(fresh: Dict[str, Any]) -> None:
    assert fresh["rc"] == 0, fresh["out"][-6000:]
    assert [s["key"] for s in fresh["scenes"]] == ["f1", "f2", "f3"]
    failed = [c for c in fresh["checks"] if not c["ok"]]
    assert fresh["checks"] and not failed, failed
    assert "the built-in default policy" in fresh["out"]


def test_no_custom_hook_is_installed_only_the_examples(fresh: Dict[str, Any]) -> None:
    for vm in ("vm-a", "vm-b", "vm-c"):
        pre = Path(fresh["work"]) / vm / "hooks" / "pre-approve.d"
        assert sorted(p.name for p in pre.iterdir()) == ["50-drain.sh.example"]
    assert not (Path(fresh["work"]) / "hooks.jsonl").exists()  # nothing ran


def test_each_impactful_event_is_approved_plainly_by_the_default_rule(fresh: Dict[str, Any]) -> None:
    for scene in fresh["scenes"]:
        rows = _decisions(fresh, scene["eventId"])
        live = [r for r in rows if r["Action"] not in ("result",) and not r.get("Shadow")]
        assert {r["Rule"] for r in live if r.get("Rule")} == {"default:impactful"}, live
        results = [r for r in rows if r["Action"] == "result" and r["State"] != "completed"]  # post-event
        assert [r["State"] for r in results] == ["approved"], results
        assert "no pre-approve hook installed" in results[0]["Reason"]
        assert results[0]["DecidedBy"] == "policy:default:impactful"
        sim = fresh["evidence"]["sim_events"][scene["eventId"]]
        assert sim["approvedBy"] == [scene["approver"]] and sim["startedAt"]


def test_no_critical_alert_and_every_alert_is_a_status_change(fresh: Dict[str, Any]) -> None:
    alerts = [a["body"] for a in fresh["evidence"]["alerts"]]
    assert alerts, "the webhook received nothing: the check would pass vacuously"
    assert not [a for a in alerts if a.get("severity") == "critical"], alerts
    assert {a.get("kind") for a in alerts} == {"event-status"}, alerts  # nothing else to tell an operator
    # by default one post per impactful event: its Scheduled alert (the approved start and the end are info)
    assert sorted((a["eventId"], a["status"]) for a in alerts) == sorted(
        (s["eventId"], "Scheduled") for s in fresh["scenes"]), alerts
    rows = {r["EventId"]: r for r in fresh["evidence"]["tables"]["Events"]}
    assert all(len(get_json(rows[s["eventId"]], "Approvals", [])) == 1 for s in fresh["scenes"])
