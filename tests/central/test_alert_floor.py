"""STATUS_ALERT_MIN_SEVERITY (default warning): an event's routine statuses are not posted. CentralService on
Azurite with alerts over real HTTP (tests/central/conftest.py), and the pure rules
(central.runtime.alert_rules)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from central.model.events import Approval, EventRecord
from central.runtime.alert_rules import below, drop_quiet, status_severity
from central.runtime.settings import CentralSettings, SettingsError

from .conftest import Env, Hook
from .factory import T0, Vm, body, event

T30, T90 = T0 + timedelta(seconds=30), T0 + timedelta(seconds=90)


def statuses(hook: Hook, event_id: str) -> list:
    return [(a["status"], a["severity"]) for a in hook.alerts()
            if a.get("eventId") == event_id and a.get("kind") == "event-status"]


def play_one_reboot(svc, a: Vm, event_id: str) -> None:
    """Scheduled, approved, Started, gone: the life of a routine reboot."""
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event(event_id, ["vm-a"])], at=T0))],
                     now=T0)
    started = a.incarnation_env([event(event_id, ["vm-a"], status="Started")], at=T30)
    svc.handle_batch([body(started)], now=T30)
    svc.handle_batch([body(a.incarnation_env([], at=T90))], now=T90)


def test_by_default_a_routine_reboot_is_posted_once_and_its_record_keeps_every_status(
        env: Env, hook: Hook, caplog: pytest.LogCaptureFixture) -> None:
    """The default: the Scheduled alert (its rule's severity, warning) is posted; the start after central's
    approval and the end are not posted, logged or written to Alerts; Incarnations and the event keep them.
    They are never owed either (dropped in the commit that changes the event): nothing is settled at
    delivery, which would cost a State write each (the se.alert marker's outcome=below-floor)."""
    svc = env.service()
    caplog.set_level("INFO")
    play_one_reboot(svc, Vm("vm-a"), "E-quiet")
    assert not [r for r in caplog.records if "outcome=below-floor" in r.getMessage()]
    assert statuses(hook, "E-quiet") == [("Scheduled", "warning")]
    assert [r["Status"] for r in env.rows("Alerts") if r["EventId"] == "E-quiet"] == ["Scheduled"]
    (row,) = env.rows("Events")
    assert [h["status"] for h in json.loads(row["History"])] == ["Scheduled", "Started", "Completed"]
    assert row["PendingAlertCount"] == 0  # nothing left owed for a timer to retry
    assert len(env.rows("Incarnations")) == 3


def test_status_alert_floor_info_posts_every_status(env: Env, hook: Hook) -> None:
    svc = env.service(STATUS_ALERT_MIN_SEVERITY="info")
    play_one_reboot(svc, Vm("vm-a"), "E-loud")
    assert statuses(hook, "E-loud") == [("Scheduled", "warning"), ("Started", "info"), ("Completed", "info")]


def test_status_alert_floor_critical_posts_no_warning(env: Env, hook: Hook) -> None:
    svc = env.service(STATUS_ALERT_MIN_SEVERITY="critical")
    play_one_reboot(svc, Vm("vm-a"), "E-crit")
    assert statuses(hook, "E-crit") == []


def test_a_start_central_did_not_approve_is_posted(env: Env, hook: Hook) -> None:
    """The policy holds the event (no approval goes out) and Azure starts it anyway: that start is news."""
    svc = env.service(POLICY_JSON=json.dumps({"version": 1, "rules": [{"name": "manual", "action": "hold"}]}))
    a = Vm("vm-a")
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-forced", ["vm-a"])], at=T0))],
                     now=T0)
    assert env.messages(a.vm_id) == []
    started = a.incarnation_env([event("E-forced", ["vm-a"], status="Started")], at=T30)
    svc.handle_batch([body(started)], now=T30)
    posted = statuses(hook, "E-forced")
    assert [s for s, _ in posted] == ["Scheduled", "Started"]
    assert all(severity != "info" for _, severity in posted)


def test_a_start_after_notbefore_passed_unapproved_is_posted(env: Env, hook: Hook) -> None:
    """Held by the policy; the timer records NotBefore passing (the `expired` decision keeps the event's
    severity, not info); then Azure starts it: posted. An event first seen after its NotBefore (a report
    central caught up on) is posted too."""
    svc = env.service(POLICY_JSON=json.dumps({"version": 1, "rules": [{"name": "manual", "action": "hold"}]}))
    a = Vm("vm-a")
    nb = T0 + timedelta(seconds=60)
    svc.handle_batch([body(a.heartbeat()),
                      body(a.incarnation_env([event("E-late", ["vm-a"], not_before=nb)], at=T0))], now=T0)
    svc.reevaluate(now=nb + timedelta(seconds=5))
    assert svc.event("E-late", now=nb + timedelta(seconds=5))["state"] == "expired"
    started = a.incarnation_env([event("E-late", ["vm-a"], status="Started")], at=nb + timedelta(seconds=20))
    svc.handle_batch([body(started)], now=nb + timedelta(seconds=20))
    assert statuses(hook, "E-late") == [("Scheduled", "warning"), ("Started", "warning")]
    b = Vm("vm-b")
    past = event("E-past", ["vm-b"], not_before=T0 - timedelta(seconds=30))
    svc.handle_batch([body(b.heartbeat()), body(b.incarnation_env([past], at=T0))], now=T0)
    assert statuses(hook, "E-past") == [("Scheduled", "warning")]
    # ...at its rule's severity: an info rule's event first seen after its NotBefore is not posted
    svc_default = env.service()
    c = Vm("vm-c")
    user = event("E-past-user", ["vm-c"], source="User", not_before=T0 - timedelta(seconds=30))
    svc_default.handle_batch([body(c.heartbeat()), body(c.incarnation_env([user], at=T0))], now=T0)
    assert svc_default.event("E-past-user", now=T0)["state"] == "expired"
    assert statuses(hook, "E-past-user") == []


def test_an_info_rule_s_event_is_not_posted_at_all(env: Env, hook: Hook) -> None:
    """A rule marked info (here Microsoft's default for user-initiated events): its Scheduled alert, owed
    before the decision, is dropped in the commit that decides it."""
    svc = env.service()
    a = Vm("vm-a")
    ev = event("E-user", ["vm-a"], source="User")
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([ev], at=T0))], now=T0)
    assert len(env.messages(a.vm_id)) == 1  # approved
    assert statuses(hook, "E-user") == []
    assert [r for r in env.rows("Alerts") if r["EventId"] == "E-user"] == []


def test_an_alert_owed_under_another_floor_is_settled_unposted_by_a_default_instance(
        env: Env, hook: Hook, caplog: pytest.LogCaptureFixture) -> None:
    """An instance set to info owes the end's alert and cannot deliver it (webhook down); an instance with
    the default floor's timer settles it without posting (the delivery's guard: owed before its severity
    was known, or under another setting), and it is never retried."""
    loud = env.service(STATUS_ALERT_MIN_SEVERITY="info", ALERT_MAX_ATTEMPTS="1")
    a = Vm("vm-a")
    loud.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-old", ["vm-a"])], at=T0))],
                      now=T0)
    hook.fail_next(5)
    loud.handle_batch([body(a.incarnation_env([], at=T30))], now=T30)
    hook.fail_next(0)
    quiet = env.service()
    caplog.set_level("INFO")
    quiet.reevaluate(now=T0 + timedelta(seconds=200))
    assert [r.getMessage() for r in caplog.records if "outcome=below-floor" in r.getMessage()] == [
        "se.alert kind=event-status outcome=below-floor"]
    quiet.reevaluate(now=T0 + timedelta(seconds=400))
    assert [s for s, _ in statuses(hook, "E-old")] == ["Scheduled"]
    rows = {r["Status"]: r for r in env.rows("Alerts") if r["EventId"] == "E-old"}
    assert rows["Cancelled"]["Sent"] is False  # the loud instance's failed try, as it recorded it
    loud.reevaluate(now=T0 + timedelta(seconds=600))  # settled: nothing owed left for anyone to retry
    assert [s for s, _ in statuses(hook, "E-old")] == ["Scheduled"]


# ---- the pure rules ------------------------------------------------------------------------------

def test_status_severity() -> None:
    rec = EventRecord(event_id="E-1", first_seen=T0)
    rec.decision = {"action": "approve", "severity": "warning"}
    assert status_severity(rec, "Scheduled") == "warning"
    assert status_severity(rec, "Started") == "warning"  # nobody approved it
    rec.approvals.append(Approval(1, "m1", "id-a", "vm-a", "q-a", "hook-then-approve", "policy:reboots", T0,
                                  T0 + timedelta(minutes=6)))
    assert status_severity(rec, "Started") == "warning"  # sent, still unanswered and not started
    rec.approvals[-1].result, rec.approvals[-1].result_at = "event-started", T0 + timedelta(minutes=1)
    assert status_severity(rec, "Started") == "info"  # central's live message was out
    rec.approvals[-1].sent = False  # committed, never sent (a crash in between)
    assert status_severity(rec, "Started") == "warning"
    rec.approvals[-1].sent, rec.approvals[-1].revoked = True, True  # taken back by an operator's hold
    assert status_severity(rec, "Started") == "warning"
    rec.approvals[-1].revoked, rec.approvals[-1].result_at = False, T0 + timedelta(minutes=7)
    assert status_severity(rec, "Started") == "warning"  # expired before the start: forwarders refuse it
    rec.approvals[-1].result_at = T0 + timedelta(minutes=1)
    arm = Approval(2, "arm-E-1-2", "", "arm:vmss/web", "", "approve", "policy:reboots", T0,
                   T0 + timedelta(minutes=6), sent=False)  # ARM's: marked sent once its answer settles
    arm.result, arm.result_at = "event-started", T0 + timedelta(minutes=1)
    rec.approvals = [arm]
    assert status_severity(rec, "Started") == "info"
    rec.approvals = [Approval(1, "m1", "id-a", "vm-a", "q-a", "hook-then-approve", "policy:reboots", T0,
                              T0 + timedelta(minutes=6), result="approved", result_at=T30)]
    rec.approvals[-1].result = "hook-failed"
    assert status_severity(rec, "Started") == "warning"  # refused: Azure started it anyway
    assert status_severity(rec, "Completed") == "info" and status_severity(rec, "Cancelled") == "info"
    rec.decision = {"action": "ended-stale", "severity": "warning"}
    assert status_severity(rec, "Completed") == "warning"  # central ended it: not routine
    rec.decision = {"action": "hold", "severity": "critical"}
    assert status_severity(rec, "Scheduled") == "critical"


def test_below_and_drop_quiet() -> None:
    assert below("info", "warning") and not below("warning", "warning") and not below("critical", "warning")
    assert below("warning", "critical") and not below("info", "info")
    assert not below("unknown", "warning")  # an unknown severity counts as warning
    rec = EventRecord(event_id="E-2", first_seen=T0, status="Completed")
    rec.pending_alerts = [
        {"key": "E-2:Scheduled", "kind": "event-status", "status": "Scheduled"},
        {"key": "E-2:Completed", "kind": "event-status", "status": "Completed"},
        {"key": "E-2:approval-failed", "kind": "approval-failed", "severity": "critical"},
    ]
    assert drop_quiet(rec, "warning") == {"E-2:Completed"}
    assert [a["key"] for a in rec.pending_alerts] == ["E-2:Scheduled", "E-2:approval-failed"]
    assert drop_quiet(rec, "info") == set()


def test_the_setting_is_checked() -> None:
    assert CentralSettings.from_mapping({}).status_alert_floor == "warning"
    loud = CentralSettings.from_mapping({"STATUS_ALERT_MIN_SEVERITY": " Critical "})
    assert loud.status_alert_floor == "critical"
    with pytest.raises(SettingsError, match="must be one of info, warning, critical, got 'error'"):
        CentralSettings.from_mapping({"STATUS_ALERT_MIN_SEVERITY": "error"})
