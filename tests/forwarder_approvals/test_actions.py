"""hook-then-approve, the fast path, recovery and `se-forwarder approve`, over the simulator and Azurite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from forwarder.approvals import naming
from sandbox import processes
from sandbox.imds.client import ImdsSimulator, wait_for

from .helpers import VM0, Rig, approval, write_hook


def _event(rig: Rig, **spec) -> str:
    spec.setdefault("eventType", "Redeploy")
    spec.setdefault("resources", ["vm0"])
    return rig.sim.add_event(**spec)["eventId"]


def test_hook_then_approve_runs_hook_with_event_env_then_posts(rig: Rig) -> None:
    seen = rig.hook_dir / "seen"
    write_hook(rig.hook_dir, "pre-approve", "10-drain", f'echo "$SE_EVENT_ID $SE_DECIDED_BY" > {seen}')
    event_id = _event(rig)
    rig.send(approval(event_id, action="hook-then-approve"))
    rig.poll()
    assert seen.read_text().split() == [event_id, "policy:test-rule"]
    assert len(rig.posts()) == 1
    (result,) = rig.results()
    assert result["data"]["outcome"] == "approved"
    assert result["data"]["hook"]["ok"] and result["data"]["hook"]["hooks"][0]["exitCode"] == 0


def test_hook_then_approve_failing_hook_no_post(rig: Rig) -> None:
    write_hook(rig.hook_dir, "pre-approve", "10-drain", "echo still busy; exit 4")
    event_id = _event(rig)
    rig.send(approval(event_id, action="hook-then-approve"))
    rig.poll()
    assert rig.posts() == []
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "hook-failed" and "exited 4" in reason
    assert rig.results()[0]["data"]["hook"]["hooks"][0]["output"].strip() == "still busy"
    assert rig.sim.event(event_id)["state"] == "Scheduled"
    assert rig.queue_empty()


def test_hook_then_approve_timeout_killed_no_post(rig: Rig) -> None:
    write_hook(rig.hook_dir, "pre-approve", "10-hang", "sleep 30")
    event_id = _event(rig)
    rig.send(approval(event_id, action="hook-then-approve"))
    rig.poll()  # hook timeout is 2 s in the rig
    assert rig.posts() == []
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "hook-failed" and "timed out" in reason
    assert rig.results()[0]["data"]["hook"]["hooks"][0]["timedOut"] is True


def test_a_message_that_expires_while_its_hook_runs_is_not_posted(rig: Rig) -> None:
    """Central gives up on an attempt at its expiry (it fails over to another VM or to ARM): a hook that
    outlasts the message must not be followed by a POST, which would be a second approval."""
    write_hook(rig.hook_dir, "pre-approve", "10-drain", "sleep 1.5")  # (the rig's hook timeout is 2 s)
    event_id = _event(rig)
    rig.send(approval(event_id, action="hook-then-approve", expires_in=1.0))
    rig.poll()
    assert rig.posts() == []
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "rejected" and reason.startswith("stale: the message expired")
    assert rig.results()[0]["data"]["hook"]["hooks"][0]["exitCode"] == 0
    assert rig.sim.event(event_id)["state"] == "Scheduled"


def test_hook_then_approve_without_any_hook_approves_and_says_so(rig: Rig) -> None:
    """A fresh install has no pre-approve hook: the default policy's hook-then-approve approves plainly;
    the result's reason (an existing field, no schema change) says no hook was installed."""
    event_id = _event(rig)
    rig.send(approval(event_id, action="hook-then-approve"))
    rig.poll()
    assert len(rig.posts()) == 1
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "approved" and "no pre-approve hook installed" in reason, reason
    assert rig.results()[0]["data"]["hook"]["hooks"] == []


def test_hook_then_approve_without_any_hook_fails_when_a_hook_is_required(rig: Rig) -> None:
    rig.service.settings.require_hook = True  # require_pre_approve_hook (before the approver is built)
    event_id = _event(rig)
    rig.send(approval(event_id, action="hook-then-approve"))
    rig.poll()
    assert rig.posts() == []
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "hook-failed" and "no pre-approve hook" in reason
    assert "require_pre_approve_hook" in reason


def test_an_imds_description_no_environment_can_hold_never_escapes_the_approver(rig: Rig) -> None:
    """A NUL byte and a lone surrogate in Description (what JSON from IMDS may carry) reach the hook as
    U+FFFD; the approval goes through instead of becoming an exception and a poison message."""
    out = rig.hook_dir / "seen"
    write_hook(rig.hook_dir, "pre-approve", "10-record", f'printf "%s" "$SE_DESCRIPTION" > {out}')
    event_id = rig.sim.add_event(eventType="Reboot", resources=["vm0"],
                                 description="drain\u0000now \ud800 please")["eventId"]
    rig.send(approval(event_id, action="hook-then-approve"))
    rig.poll()
    assert [o for o, _ in rig.outcomes()] == ["approved"] and len(rig.posts()) == 1
    assert out.read_text(encoding="utf-8") == "drain\ufffdnow \ufffd please"


@pytest.fixture
def slow_sim(tmp_path: Path):
    """A simulator at time scale 10: a Preempt's 30 s of notice is 3 s real."""
    from sandbox import processes

    args = ["--time-scale", "10", "--vm", json.dumps(VM0)]
    server = processes.start_imds(args, log_dir=tmp_path / "imds10")
    yield ImdsSimulator(f"http://127.0.0.1:{server.port}")
    server.stop()


def test_fast_path_approves_preempt_locally_within_the_notice(slow_sim: ImdsSimulator, azurite,
                                                               tmp_path: Path) -> None:
    from .helpers import make_rig

    rig = make_rig(slow_sim.base_url, azurite.extra["connection_string"], tmp_path)
    try:
        marker = rig.hook_dir / "drained"
        write_hook(rig.hook_dir, "pre-approve", "10-drain", f"echo $SE_EVENT_TYPE > {marker}")
        event_id = rig.sim.add_event(eventType="Preempt", resources=["vm0"])["eventId"]
        rig.observe()
        assert rig.service.fastpath is not None
        rig.service.fastpath.join()
        assert len(rig.posts()) == 1 and marker.read_text().strip() == "Preempt"
        event = rig.sim.event(event_id)
        # approvedBy is set only by a POST that started it: NotBefore had not passed yet
        assert event["state"] == "Started" and event["approvedBy"] == ["vm0"]
        (result,) = rig.results()
        assert result["data"]["decidedBy"] == "local:fastpath" and result["data"]["outcome"] == "approved"
        assert result["data"]["messageId"] is None
        rig.observe()  # seen again: handled once only
        rig.service.fastpath.join()
        assert len(rig.posts()) == 1 and len(rig.results()) == 1
    finally:
        rig.service.close()
        rig.queue.close()
        rig.outbox.close()
        rig.imds.close()


def test_fast_path_without_local_approve_runs_hook_only(rig: Rig) -> None:
    marker = rig.hook_dir / "drained"
    write_hook(rig.hook_dir, "pre-approve", "10-drain", f"touch {marker}")
    rig.service.settings.local_approve = False
    rig.sim.add_event(eventType="Terminate", resources=["vm0"])
    rig.observe()
    assert rig.service.fastpath is not None
    rig.service.fastpath.join()
    assert marker.exists() and rig.posts() == [] and rig.results() == []


def test_fast_path_ignores_other_types(rig: Rig) -> None:
    _event(rig, eventType="Reboot")
    rig.observe()
    assert rig.service.fastpath is not None
    rig.service.fastpath.join()
    assert rig.posts() == [] and rig.results() == []


def test_post_event_hook_runs_when_event_disappears(rig: Rig) -> None:
    out = rig.hook_dir / "post"
    write_hook(rig.hook_dir, "post-event", "10-undrain", f'echo "$SE_EVENT_ID $SE_EVENT_END" >> {out}')
    # Started for 60 simulated seconds (1 s real): the observe below must see it Started (at 1 s simulated it
    # lasted 17 ms real; a loaded machine's observe came after it ended: reported cancelled, not completed)
    done = _event(rig, eventType="Freeze", resources=["vm0", "vm1"], startedSeconds=60)
    cancelled = _event(rig, eventType="Reboot")
    rig.observe()
    rig.sim.approve([done], vm="vm0")
    rig.observe()  # seen Started
    rig.sim.cancel(cancelled)
    wait_for(lambda: not rig.sim.document("vm0")["Events"], timeout=10)
    rig.observe()
    assert rig.service.recovery is not None
    rig.service.recovery.join()
    assert sorted(out.read_text().splitlines()) == sorted([f"{done} completed", f"{cancelled} cancelled"])
    outcomes = {r["data"]["eventId"]: r["data"]["outcome"] for r in rig.results()}
    assert outcomes == {done: "completed", cancelled: "completed"}
    assert rig.service.recovery.watched() == []


def test_failing_post_event_hook_reported(rig: Rig) -> None:
    write_hook(rig.hook_dir, "post-event", "10-fail", "exit 9")
    event_id = _event(rig)
    rig.observe()
    rig.sim.cancel(event_id)
    rig.observe()
    assert rig.service.recovery is not None
    rig.service.recovery.join()
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "post-hook-failed" and "exited 9" in reason


def test_recovery_survives_restart(rig: Rig, tmp_path: Path) -> None:
    """An event that ends while the forwarder is down is noticed on the first document after restart."""
    from forwarder.recovery import Recovery

    event_id = _event(rig)
    rig.observe()
    rig.sim.cancel(event_id)
    published = []
    again = Recovery(str(rig.state_dir), VM0["vmId"], "vm0", published.append)
    again.observe(rig.document())
    again.join()
    assert [(r.event_id, r.outcome) for r in published] == [(event_id, "completed")]


def test_a_post_event_report_lost_to_a_crash_runs_the_hooks_again_on_restart(rig: Rig) -> None:
    """At least once: an event that has gone stays in the state file until its result is published, so a
    forwarder that stopped between the hook and the report runs the hooks again and reports after it
    starts. (Before, the event left the file before its hooks ran: the report was lost.)"""
    from forwarder.recovery import FILE_NAME, Recovery

    out = rig.hook_dir / "post"
    write_hook(rig.hook_dir, "post-event", "10-undrain", f'echo "$SE_EVENT_ID $SE_EVENT_END" >> {out}')
    event_id = _event(rig)
    rig.observe()
    rig.sim.cancel(event_id)
    gone = rig.document()

    def crash(_result: object) -> None:
        raise OSError("the process stopped before the report")  # what a SIGKILL there would leave

    first = Recovery(str(rig.state_dir), VM0["vmId"], "vm0", crash, rig.service.recovery.hook_settings)
    first.observe(gone)
    first.join()
    assert out.read_text().split() == [event_id, "cancelled"]
    assert event_id in json.loads((rig.state_dir / FILE_NAME).read_text())  # still owed
    published: list = []
    again = Recovery(str(rig.state_dir), VM0["vmId"], "vm0", published.append, first.hook_settings)
    again.observe(gone)
    again.join()
    assert [(r.event_id, r.outcome) for r in published] == [(event_id, "completed")]
    assert out.read_text().split() == [event_id, "cancelled"] * 2  # the hook ran again
    assert event_id not in json.loads((rig.state_dir / FILE_NAME).read_text())
    again.observe(gone)  # reported: not again
    again.join()
    assert len(published) == 1


def _cli(sim: ImdsSimulator, rig: Rig, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forwarder", "approve", *args,
                           "--imds-url", sim.vm_url("vm0"), "--state-dir", str(rig.state_dir),
                           "--hook-dir", str(rig.hook_dir), "--config", str(rig.state_dir / "none.json")],
                          capture_output=True, text=True, timeout=60,
                          env=processes.minimal_env(SUDO_USER="alice", USER="ceo", LOGNAME="ceo"))


def test_cli_approve_posts_and_reports(rig: Rig, sim: ImdsSimulator) -> None:
    """Who approved is the session's login (or the process's account), not SUDO_USER / USER / LOGNAME,
    which the caller sets (here SUDO_USER=alice, USER=ceo, LOGNAME=ceo)."""
    from forwarder.cli import _operator

    (rig.state_dir / "none.json").write_text("{}")
    event_id = _event(rig)
    done = _cli(sim, rig, event_id)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    who = f"operator:{_operator()}"
    assert who not in ("operator:alice", "operator:ceo")
    assert report["outcome"] == "approved" and report["decidedBy"] == who and report["reported"]
    assert len(rig.posts()) == 1
    assert [r["data"]["decidedBy"] for r in rig.results()] == [who]
    again = _cli(sim, rig, event_id)  # already approved: same checks refuse, nothing POSTed
    assert again.returncode == 7 and len(rig.posts()) == 1


def test_cli_approve_checks_and_hook(rig: Rig, sim: ImdsSimulator) -> None:
    (rig.state_dir / "none.json").write_text("{}")
    unknown = _cli(sim, rig, "C7061BAC-AFDC-4513-B24B-AA5F13A16123")
    assert unknown.returncode == 7 and json.loads(unknown.stdout)["reason"].startswith("unknown-event")
    theirs = _event(rig, resources=["vm1"], audience=["vm0", "vm1"])
    assert _cli(sim, rig, theirs).returncode == 7
    write_hook(rig.hook_dir, "pre-approve", "10-fail", "exit 1")
    mine = _event(rig)
    hooked = _cli(sim, rig, mine, "--hook")
    assert hooked.returncode == 7 and json.loads(hooked.stdout)["outcome"] == "hook-failed"
    assert rig.posts() == []


@pytest.mark.parametrize("vm_id", [VM0["vmId"], "0F8E6B52-1D5C-4D3A-9A61-2B7C1E0A0000", "weird__ID..x",
                                   "", "-" * 5, "a" * 61, "ÄÖ-vm"])
def test_queue_name_rule_matches_central(vm_id: str) -> None:
    central = pytest.importorskip("central.runtime.approval_queue")
    assert naming.queue_name(vm_id) == central.queue_name(vm_id)
    name = naming.queue_name(vm_id)
    assert 3 <= len(name) <= 63 and name == name.lower() and "--" not in name


def test_fast_path_and_central_approval_race_posts_once(slow_sim: ImdsSimulator, azurite,
                                                       tmp_path: Path) -> None:
    from .helpers import make_rig

    rig = make_rig(slow_sim.base_url, azurite.extra["connection_string"], tmp_path)
    try:
        write_hook(rig.hook_dir, "pre-approve", "10-drain", "sleep 1")
        event_id = rig.sim.add_event(eventType="Preempt", resources=["vm0"])["eventId"]
        rig.observe()  # the fast path starts its hook on its own thread
        rig.send(approval(event_id))
        rig.poll()  # central's approval for the same event arrives while the hook runs
        assert rig.service.fastpath is not None
        rig.service.fastpath.join()
        assert len(rig.posts()) == 1
        # whichever got the event first approved it; the other found it in the ledger
        outcomes = sorted((r["data"]["outcome"], r["data"]["reason"].split(":")[0]) for r in rig.results())
        assert outcomes == [("approved", "StartRequests accepted by IMDS"), ("rejected", "duplicate")]
        assert {r["data"]["decidedBy"] for r in rig.results()} == {"local:fastpath", "policy:test-rule"}
    finally:
        rig.service.close()
        rig.queue.close()
        rig.outbox.close()
        rig.imds.close()


def test_two_processes_ledgers_on_one_file_let_one_claim_an_event(tmp_path: Path) -> None:
    """The daemon and `se-forwarder approve` each hold a Ledger on the same file: the first claim wins and
    the second is given the winner's entry, whichever process reads the file first."""
    from forwarder.approvals.ledger import Ledger

    daemon, operator = Ledger(str(tmp_path)), Ledger(str(tmp_path))
    assert daemon.event("E1") is None and operator.event("E1") is None  # both found it free
    assert daemon.claim_event("E1", "m1", "central") is None
    held = operator.claim_event("E1", None, "operator:olga")
    assert held is not None and held["state"] == "pending" and held["decidedBy"] == "central"
    assert Ledger(str(tmp_path)).event("E1")["decidedBy"] == "central"  # the file: the winner's claim
    operator.forget_event("E1")  # the winner's POST failed: a new decision may claim it again
    assert operator.claim_event("E1", None, "operator:olga") is None
