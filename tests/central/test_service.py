"""CentralService on Azurite (real azure-data-tables / azure-storage-queue) with alerts over real HTTP."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

import schemas
from central.model.times import parse
from central.runtime import service as service_module
from central.runtime.service import CentralService, InvalidRequest, UnknownEvent

from .conftest import Env, Hook
from .factory import T0, Vm, body, event


def status_alerts(hook: Hook, event_id: str):
    return [a for a in hook.alerts() if a.get("eventId") == event_id and a.get("kind") == "event-status"]


def test_one_event_two_vms_one_approval_to_the_leader_and_one_alert(env: Env, hook: Hook) -> None:
    svc = env.service()
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-two", ["vm-b", "vm-a"])
    result = svc.handle_batch(
        [
            body(b.heartbeat()),
            body(a.heartbeat()),
            body(b.incarnation_env([ev])),
            body(a.incarnation_env([ev])),
        ],
        now=T0,
    )
    assert result.processed == 4 and result.approvals_sent == 1
    msgs = env.messages(a.vm_id)
    assert len(msgs) == 1 and env.messages(b.vm_id) == []  # leader: first live VM in sorted Resources
    msg = msgs[0]
    assert schemas.errors("approval.schema.json", msg) == []
    assert msg["eventId"] == "E-two" and msg["vmName"] == "vm-a" and msg["action"] == "hook-then-approve"
    assert parse(msg["expiresAt"]) <= parse(ev["NotBefore"])
    alerts = status_alerts(hook, "E-two")
    assert [x["status"] for x in alerts] == ["Scheduled"]
    (row,) = env.rows("Events")
    assert row["EventId"] == "E-two" and row["LeaderVmName"] == "vm-a" and row["ReporterCount"] == 2
    assert json.loads(row["ReportedBy"]) == {"vm-a": a.vm_id, "vm-b": b.vm_id}
    assert len(env.rows("Incarnations")) == 2 and len(env.rows("Vms")) == 2


def test_duplicates_and_replays_change_nothing_twice(env: Env, hook: Hook) -> None:
    svc = env.service()
    a = Vm("vm-a")
    ev = event("E-dup", ["vm-a"])
    batch = [body(a.heartbeat()), body(a.incarnation_env([ev]))]
    svc.handle_batch(batch + batch, now=T0)  # duplicates inside one batch
    rows_before = {t: len(env.rows(t)) for t in ("Incarnations", "Events", "Decisions", "Alerts")}
    again = svc.handle_batch(batch, now=T0 + timedelta(seconds=5))  # a replay (checkpoint lost)
    assert again.duplicates == 2 and again.approvals_sent == 0 and again.decisions == []
    # a fresh instance (restart) replaying the same envelopes: state comes back from the log store
    fresh = env.service()
    replay = fresh.handle_batch(batch, now=T0 + timedelta(seconds=10))
    assert replay.approvals_sent == 0 and replay.stale == 1 and replay.decisions == []
    assert {t: len(env.rows(t)) for t in rows_before} == rows_before
    assert len(env.messages(a.vm_id)) == 1
    assert len(status_alerts(hook, "E-dup")) == 1


def test_a_replay_after_the_duplicate_window_is_stale_and_changes_nothing(
        env: Env, hook: Hook, monkeypatch: pytest.MonkeyPatch) -> None:
    """The instance forgets envelope ids SEEN_SECONDS after it met them (flat memory at steady load): a
    replay that comes later is judged by incarnation, as on a fresh instance, and changes nothing twice."""
    monkeypatch.setattr(service_module, "SEEN_SECONDS", 0.2)
    svc = env.service()
    a = Vm("vm-a")
    batch = [body(a.heartbeat()), body(a.incarnation_env([event("E-win", ["vm-a"])]))]
    svc.handle_batch(batch, now=T0)
    rows_before = {t: len(env.rows(t)) for t in ("Incarnations", "Events", "Decisions", "Alerts")}
    assert svc.handle_batch(batch, now=T0 + timedelta(seconds=5)).duplicates == 2  # inside the window
    time.sleep(0.5)  # the window (a monotonic clock) is over: the ids are forgotten
    late = svc.handle_batch(batch, now=T0 + timedelta(seconds=10))
    assert late.duplicates == 0 and late.stale == 1 and late.approvals_sent == 0 and late.decisions == []
    assert {t: len(env.rows(t)) for t in rows_before} == rows_before
    assert len(env.messages(a.vm_id)) == 1 and len(status_alerts(hook, "E-win")) == 1


def test_out_of_order_older_incarnation_does_not_regress(env: Env, hook: Hook) -> None:
    svc = env.service(STATUS_ALERT_MIN_SEVERITY="info")  # every status's alert, in order
    a = Vm("vm-a")
    sched = a.incarnation_env([event("E-ord", ["vm-a"])], at=T0)
    started = a.incarnation_env([event("E-ord", ["vm-a"], status="Started")], at=T0 + timedelta(seconds=30))
    gone = a.incarnation_env([], at=T0 + timedelta(seconds=60))
    svc.handle_batch(
        [body(a.heartbeat()), body(sched), body(started), body(gone)], now=T0 + timedelta(seconds=61)
    )
    late = svc.handle_batch([body(started)], now=T0 + timedelta(seconds=70))  # a late copy: duplicate
    assert late.duplicates == 1
    fresh = env.service()  # cold instance: by incarnation
    stale = fresh.handle_batch([body(sched)], now=T0 + timedelta(seconds=80))
    assert stale.stale == 1
    (row,) = env.rows("Events")
    assert row["Status"] == "Completed" and row["Ended"] is True
    assert [h["status"] for h in json.loads(row["History"])] == ["Scheduled", "Started", "Completed"]
    assert [x["status"] for x in status_alerts(hook, "E-ord")] == ["Scheduled", "Started", "Completed"]


def test_cancelled_when_gone_from_every_reporting_vm_without_starting(env: Env, hook: Hook) -> None:
    svc = env.service(STATUS_ALERT_MIN_SEVERITY="info")  # the end's alert too (test_alert_floor.py)
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-can", ["vm-a", "vm-b"])
    svc.handle_batch([body(a.incarnation_env([ev])), body(b.incarnation_env([ev]))], now=T0)
    svc.handle_batch([body(a.incarnation_env([]))], now=T0 + timedelta(seconds=5))
    assert svc.pending()[0]["status"] == "Scheduled"  # b still lists it
    svc.handle_batch([body(b.incarnation_env([]))], now=T0 + timedelta(seconds=6))
    assert svc.pending() == []
    (row,) = env.rows("Events")
    assert row["Status"] == "Cancelled"
    assert [x["status"] for x in status_alerts(hook, "E-can")] == ["Scheduled", "Cancelled"]


def test_silent_leader_fails_over_after_the_timeout_never_two_outstanding(env: Env, hook: Hook) -> None:
    svc = env.service(APPROVAL_RESULT_TIMEOUT_SECONDS="60", APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS="60")
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-fail", ["vm-a", "vm-b"])
    svc.handle_batch(
        [
            body(a.heartbeat()),
            body(b.heartbeat()),
            body(a.incarnation_env([ev])),
            body(b.incarnation_env([ev])),
        ],
        now=T0,
    )
    first = env.messages(a.vm_id)[0]
    assert svc.reevaluate(now=T0 + timedelta(seconds=30)) == []  # still waiting for vm-a
    decisions = svc.reevaluate(now=T0 + timedelta(seconds=61))
    assert [d.action for d in decisions] == ["failover"] and decisions[0].leader_vm_name == "vm-b"
    second = env.messages(b.vm_id)[0]
    assert parse(first["expiresAt"]) <= T0 + timedelta(seconds=61)  # the first had expired: one outstanding
    assert second["eventId"] == "E-fail" and second["messageId"] != first["messageId"]
    # vm-b reports the approval: no further failover
    svc.handle_batch(
        [body(b.result("E-fail", "approved", second["messageId"]))], now=T0 + timedelta(seconds=70)
    )
    assert svc.reevaluate(now=T0 + timedelta(seconds=200)) == []
    view = svc.pending()[0]
    assert view["outcome"] == "approved" and view["state"] == "approved"
    assert [x["result"] for x in view["approvals"]] == ["timeout", "approved"]


@pytest.mark.parametrize("liveness, cause", [
    ("300", "is alive (last heard 2026"),  # heard at T0, within liveness: it did not read or answer
    ("45", "is silent (last heard 2026"),   # not heard for 61 s: its forwarder is down
])
def test_an_approval_that_expires_unanswered_raises_one_alert_naming_the_likely_cause(
        env: Env, hook: Hook, liveness: str, cause: str) -> None:
    svc = env.service(APPROVAL_RESULT_TIMEOUT_SECONDS="60", APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS="60",
                      LEADER_LIVENESS_SECONDS=liveness)
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-tmo", ["vm-a", "vm-b"])
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([ev])), body(b.incarnation_env([ev]))],
                     now=T0)
    assert len(env.messages(a.vm_id)) == 1
    svc.handle_batch([body(b.heartbeat(at=T0 + timedelta(seconds=50)))], now=T0 + timedelta(seconds=50))
    svc.reevaluate(now=T0 + timedelta(seconds=61))
    svc.reevaluate(now=T0 + timedelta(seconds=62))  # the same expiry is explained once
    alerts = [x for x in hook.alerts() if x.get("kind") == "approval-timeout"]
    assert len(alerts) == 1, alerts
    (alert,) = alerts
    assert alert["eventId"] == "E-tmo" and alert["severity"] == "warning"
    assert "vm-a" in alert["title"] and f"vm-a's forwarder {cause}" in alert["text"]
    assert f"vm-{a.vm_id}" in alert["text"]  # the queue it should have read


def test_no_live_forwarder_means_no_approval_and_one_alert(env: Env, hook: Hook) -> None:
    svc = env.service(LEADER_LIVENESS_SECONDS="60")
    a = Vm("vm-a")
    svc.handle_batch([body(a.heartbeat(at=T0 - timedelta(minutes=10)))], now=T0 - timedelta(minutes=10))
    # vm-a's document was enqueued 5 minutes ago and read late (central 5 minutes behind the hub): as of
    # what central has read, its forwarder is live (central.runtime.intake_lag), so it gets the attempt
    svc.handle_batch(
        [body(a.incarnation_env([event("E-nol", ["vm-a"])], at=T0 - timedelta(minutes=5)))], now=T0,
        enqueued_times=[T0 - timedelta(minutes=5)],
    )
    assert len(env.messages(a.vm_id)) == 1
    # unanswered past its timeout (120 s), and vm-a silent for 11 minutes (more than 60 s + the 5 minutes
    # central was behind): no live forwarder is left, no second attempt, one alert
    svc.reevaluate(now=T0 + timedelta(minutes=6))
    assert next(x for x in hook.alerts() if x.get("kind") == "no-leader")["eventId"] == "E-nol"
    assert svc.pending()[0]["state"] == "no-leader" and len(env.messages(a.vm_id)) == 1
    back = T0 + timedelta(minutes=6, seconds=10)
    svc.handle_batch([body(a.heartbeat(at=back))], now=back)
    svc.reevaluate(now=back + timedelta(seconds=1))
    assert len(env.messages(a.vm_id)) == 2  # the forwarder came back: it gets the event again


BUDGET_POLICY = {
    "version": 1,
    "budgets": {"per-scale-set": {"groupBy": "scaleSet", "maxImpacted": 1}},
    "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}],
}


def test_disruption_budget_waits_then_frees(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=json.dumps(BUDGET_POLICY))
    a, b = Vm("web_0", scale_set="web"), Vm("web_1", scale_set="web")
    ea, eb = event("E-b1", ["web_0"]), event("E-b2", ["web_1"])
    svc.handle_batch(
        [
            body(a.heartbeat()),
            body(b.heartbeat()),
            body(a.incarnation_env([ea])),
            body(b.incarnation_env([eb])),
        ],
        now=T0,
    )
    assert len(env.messages(a.vm_id)) == 1 and env.messages(b.vm_id) == []
    states = {p["eventId"]: p["state"] for p in svc.pending()}
    assert states == {"E-b1": "approving", "E-b2": "waiting-budget"}
    assert svc.reevaluate(now=T0 + timedelta(seconds=10)) == []  # unchanged verdict: no new decision
    # web_0 reboots and comes back: its event is gone, the budget frees
    svc.handle_batch(
        [
            body(a.result("E-b1", "approved", env.messages(a.vm_id)[0]["messageId"])),
            body(
                a.incarnation_env(
                    [dict(ea, EventStatus="Started", NotBefore="")], at=T0 + timedelta(seconds=20)
                )
            ),
        ],
        now=T0 + timedelta(seconds=20),
    )
    assert svc.reevaluate(now=T0 + timedelta(seconds=25)) == []  # Started still counts against the budget
    # the batch that ends it hands the freed slot on at once (central.runtime.inline), not the next timer
    decisions = svc.handle_batch(
        [body(a.incarnation_env([], at=T0 + timedelta(seconds=30)))], now=T0 + timedelta(seconds=30)
    ).decisions
    assert [(d.event_id, d.state) for d in decisions] == [("E-b2", "approving")]
    assert len(env.messages(b.vm_id)) == 1
    assert svc.reevaluate(now=T0 + timedelta(seconds=32)) == []


def test_maintenance_window_holds_until_it_opens(env: Env, hook: Hook) -> None:
    pol = {
        "version": 1,
        "windows": {"evening": {"timeZone": "Europe/Oslo", "start": "18:00", "end": "20:00"}},
        "rules": [
            {
                "name": "redeploy-evening",
                "match": {"eventTypes": ["Redeploy"]},
                "action": "approve-in-window",
                "window": "evening",
                "hook": True,
            }
        ],
    }
    svc = env.service(POLICY_JSON=json.dumps(pol))
    a = Vm("vm-a")
    nb = T0 + timedelta(hours=6)
    svc.handle_batch(
        [body(a.heartbeat()), body(a.incarnation_env([event("E-win", ["vm-a"], "Redeploy", not_before=nb)]))],
        now=T0,
    )
    assert env.messages(a.vm_id) == [] and svc.pending()[0]["state"] == "waiting-window"
    opens = T0 + timedelta(hours=5)  # 17:00 UTC = 18:00 Oslo
    svc.handle_batch([body(a.heartbeat(at=opens - timedelta(seconds=5)))], now=opens - timedelta(seconds=5))
    assert svc.reevaluate(now=opens - timedelta(seconds=1)) == []
    decisions = svc.reevaluate(now=opens)
    assert [d.state for d in decisions] == ["approving"]
    (msg,) = env.messages(a.vm_id)
    assert msg["action"] == "hook-then-approve" and parse(msg["expiresAt"]) <= nb


def test_bad_envelopes_are_quarantined_and_the_rest_is_processed(env: Env, hook: Hook) -> None:
    svc = env.service()
    a = Vm("vm-a")
    good = a.incarnation_env([event("E-q", ["vm-a"], "Freeze", duration=5)])
    invalid = dict(good, id="x", data={"vm": {"vmId": a.vm_id}})  # fails the schema
    result = svc.handle_batch(
        [
            b"{not json",
            json.dumps(invalid),
            body(a.heartbeat()),
            body(good),
            body(a.quarantined("<html>oops</html>")),
        ],
        now=T0,
    )
    assert result.quarantined == 3 and result.processed == 3 and result.approvals_sent == 1
    assert env.messages(a.vm_id)[0]["action"] == "approve"  # short Freeze: approve at once
    rows = env.rows("Quarantine")
    assert sorted(r["Source"] for r in rows) == ["central", "central", "forwarder"]
    assert any("not JSON" in r["Errors"] for r in rows)
    kinds = [x["kind"] for x in hook.alerts()]
    # one alert per source per window: the body naming no VM, the schema failure that only CLAIMS vm-a
    # (unverified: it must not take vm-a's key, issue 22), and vm-a's own quarantine
    assert kinds.count("quarantined") == 3
    again = svc.handle_batch([b"{not json"], now=T0 + timedelta(seconds=1))
    assert again.quarantined == 1 and len(env.rows("Quarantine")) == 3  # same body: same row, no new alert
    assert [x["kind"] for x in hook.alerts()].count("quarantined") == 3


def test_webhook_down_is_retried_recorded_and_never_blocks(env: Env, hook: Hook) -> None:
    hook.fail_next(3)
    svc = env.service(ALERT_MAX_ATTEMPTS="3")
    a, b = Vm("vm-a"), Vm("vm-b")
    result = svc.handle_batch(
        [
            body(a.heartbeat()),
            body(b.heartbeat()),
            body(a.incarnation_env([event("E-wh", ["vm-a"])])),
            body(b.incarnation_env([event("E-wh2", ["vm-b"])])),
        ],
        now=T0,
    )
    # the first alert: 3 attempts, all refused; the second: not tried (endpoint down), no stall
    assert hook.attempts() == 3 and result.alerts_failed == 2 and hook.alerts() == []
    assert result.approvals_sent == 2 and len(env.messages(a.vm_id)) == 1 and len(env.messages(b.vm_id)) == 1
    rows = {r["EventId"]: r for r in env.rows("Alerts")}
    assert rows["E-wh"]["Sent"] is False and rows["E-wh"]["Attempts"] == 3 and "500" in rows["E-wh"]["Error"]
    assert rows["E-wh2"]["Sent"] is False and rows["E-wh2"]["Attempts"] == 0
    # the endpoint is back: the timer delivers both, once each
    svc.reevaluate(now=T0 + timedelta(seconds=30))
    assert sorted(x["eventId"] for x in hook.alerts()) == ["E-wh", "E-wh2"]
    assert all(r["Sent"] is True and r["Rounds"] == 2 for r in env.rows("Alerts"))
    svc.reevaluate(now=T0 + timedelta(seconds=60))
    assert len(hook.alerts()) == 2


def test_no_webhook_the_default_logs_each_alert_and_calls_none_a_failure(
    env: Env, hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    """ALERT_WEBHOOK_URL empty (infra's default): the alert's text is logged and its Alerts row written, as a
    delivery to the log, not a failure: no failed counter, no warning-level se.alert line, GivenUp false."""
    svc = env.service(ALERT_WEBHOOK_URL="")
    a = Vm("vm-a")
    caplog.set_level("INFO")
    result = svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-log", ["vm-a"])]))],
                              now=T0)
    assert result.alerts_logged >= 1 and result.alerts_failed == 0 and result.alerts_sent == 0
    assert hook.attempts() == 0
    row = next(r for r in env.rows("Alerts") if r["EventId"] == "E-log")
    assert (row["Sent"], row["GivenUp"], row["Outcome"]) == (False, False, "logged")
    markers = [r for r in caplog.records if r.getMessage().startswith("se.alert ")]
    assert markers
    assert all(r.levelname == "INFO" and r.getMessage().endswith("outcome=logged") for r in markers)
    assert any("alert (no webhook configured)" in r.getMessage() and "E-log" in r.getMessage()
               for r in caplog.records if r.levelname == "WARNING")
    assert svc.counters["alertsLogged"] == result.alerts_logged and svc.counters["alertsFailed"] == 0


def test_webhook_unreachable_is_bounded(env: Env, hook: Hook) -> None:
    dead = env.service(ALERT_WEBHOOK_URL="http://127.0.0.1:9/", ALERT_MAX_ATTEMPTS="2")
    b = Vm("vm-b")
    r2 = dead.handle_batch([body(b.heartbeat()), body(b.incarnation_env([event("E-wh3", ["vm-b"])]))], now=T0)
    assert r2.alerts_failed == 1 and r2.approvals_sent == 1
    (row,) = env.rows("Alerts")
    assert row["Attempts"] == 2 and "Connection" in row["Error"]
    for i in range(1, 8):  # bounded: at most ALERT_ROUNDS delivery rounds in all
        dead.reevaluate(now=T0 + timedelta(seconds=i))
    assert env.rows("Alerts")[0]["Rounds"] == 5


def test_outbox_drops_alert_once_per_increase(env: Env, hook: Hook) -> None:
    svc = env.service()
    a = Vm("vm-a")
    svc.handle_batch([body(a.heartbeat(at=T0, dropped=0))], now=T0)
    svc.handle_batch(
        [
            body(a.heartbeat(at=T0 + timedelta(seconds=1), dropped=4)),
            body(a.heartbeat(at=T0 + timedelta(seconds=2), dropped=4)),
        ],
        now=T0 + timedelta(seconds=2),
    )
    drops = [x for x in hook.alerts() if x.get("kind") == "outbox-dropped"]
    assert len(drops) == 1 and drops[0]["facts"]["dropped"] == 4


@pytest.mark.parametrize("fmt, key", [("teams", "@type"), ("slack", "blocks")])
def test_alert_formats(env: Env, hook: Hook, fmt: str, key: str) -> None:
    svc = env.service(ALERT_WEBHOOK_FORMAT=fmt, STATUS_ALERT_MIN_SEVERITY="info")  # (a User event: info)
    a = Vm("vm-a")
    svc.handle_batch([body(a.incarnation_env([event(f"E-{fmt}", ["vm-a"], source="User")]))], now=T0)
    (alert,) = hook.alerts()
    assert key in alert
    text = json.dumps(alert)
    assert f"E-{fmt}" in text


def test_invalid_policy_holds_everything_and_says_why(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=json.dumps({"version": 1, "rules": [{"name": "x", "action": "yolo"}]}))
    health = svc.health(now=T0)
    assert health["status"] == "degraded" and health["policy"]["valid"] is False
    assert health["policy"]["errors"][0]["path"] == "/rules/0/action"
    a = Vm("vm-a")
    svc.handle_batch(
        [body(a.heartbeat()), body(a.incarnation_env([event("E-inv", ["vm-a"], source="User")]))], now=T0
    )
    assert env.messages(a.vm_id) == []
    view = svc.pending()[0]
    assert view["state"] == "held" and "policy invalid" in view["decision"]["reason"]
    assert any(x.get("kind") == "policy-invalid" for x in hook.alerts())


def test_operator_hold_and_approve(env: Env, hook: Hook) -> None:
    pol = {"version": 1, "rules": [{"name": "manual", "action": "hold"}]}
    svc = env.service(POLICY_JSON=json.dumps(pol))
    a = Vm("vm-a")
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-op", ["vm-a"])]))], now=T0)
    assert env.messages(a.vm_id) == []
    with pytest.raises(UnknownEvent):
        svc.decide("nope", "approve", "alice", "x", now=T0)
    with pytest.raises(InvalidRequest):
        svc.decide("E-op", "reboot", "alice", "x", now=T0)
    view = svc.decide("E-op", "approve", "alice", "maintenance agreed", now=T0 + timedelta(seconds=5))
    assert view["leader"]["vmName"] == "vm-a"
    (msg,) = env.messages(a.vm_id)
    assert msg["decidedBy"] == "operator:alice" and msg["action"] == "approve"
    with pytest.raises(InvalidRequest, match="NotBefore"):
        svc.decide("E-op", "approve", "alice", "late", now=T0 + timedelta(hours=1))


def test_operator_approve_of_a_held_event_already_approved_lifts_the_hold_on_record(
    env: Env, hook: Hook
) -> None:
    """An approval went out, then an operator held the event, then one approves it: no second approval is
    sent, and lifting the hold is a decision like any other (who, why; a Decisions row and an alert)."""
    svc = env.service()
    a = Vm("vm-a")
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-rel", ["vm-a"])]))], now=T0)
    assert len(env.messages(a.vm_id)) == 1  # the default policy approved it
    svc.decide("E-rel", "hold", "alice", "wait for the release train", now=T0 + timedelta(seconds=5))
    view = svc.decide("E-rel", "approve", "bob", "train left", now=T0 + timedelta(seconds=10))
    assert view["state"] != "held" and len(env.messages(a.vm_id)) == 1
    rows = [r for r in env.rows("Decisions") if r["EventId"] == "E-rel" and r["Rule"] == "operator"]
    last = max(rows, key=lambda r: r["Seq"])
    assert (last["Action"], last["DecidedBy"]) == ("operator-release", "operator:bob")
    assert "already outstanding" in last["Reason"] and "train left" in last["Reason"]
    assert any(x.get("kind") == "operator-decision" and "bob chose release" in x.get("title", "")
               for x in hook.alerts())


def test_an_operator_cannot_approve_an_event_whose_approval_was_confirmed(env: Env, hook: Hook) -> None:
    """At most once: after the VM confirmed its approval (still Scheduled: IMDS starts it soon), an operator's
    approve, even after a hold, is refused with the reason; no second message is sent."""
    svc = env.service()
    a = Vm("vm-a")
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-done", ["vm-a"])]))], now=T0)
    (msg,) = env.messages(a.vm_id)
    svc.handle_batch([body(a.result("E-done", "approved", msg["messageId"], at=T0 + timedelta(seconds=3)))],
                     now=T0 + timedelta(seconds=4))
    with pytest.raises(InvalidRequest, match="already approved"):
        svc.decide("E-done", "approve", "alice", "again", now=T0 + timedelta(seconds=5))
    svc.decide("E-done", "hold", "alice", "wait", now=T0 + timedelta(seconds=6))
    with pytest.raises(InvalidRequest, match="already approved"):
        svc.decide("E-done", "approve", "alice", "go", now=T0 + timedelta(seconds=7))
    assert len(env.messages(a.vm_id)) == 1


def test_large_document_is_split_across_columns(env: Env, hook: Hook) -> None:
    svc = env.service()
    a = Vm("vm-a")
    events = [
        dict(event(f"E-big-{i:03d}", ["vm-a"], source="User"), Description="d" * 4000) for i in range(30)
    ]
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env(events))], now=T0)
    (row,) = env.rows("Incarnations")
    assert row["DocumentParts"] > 1
    text = row["Document"] + "".join(row[f"Document_{i}"] for i in range(1, row["DocumentParts"]))
    assert len(json.loads(text)["Events"]) == 30
    assert len(env.rows("Events")) == 30


def test_from_settings_identity_based_and_clear_errors() -> None:
    from azure.identity import ManagedIdentityCredential

    from central.runtime.settings import SettingsError

    svc = CentralService.from_settings(
        {
            "ApprovalStorage__tableServiceUri": "https://acct.table.core.windows.net",
            "ApprovalStorage__queueServiceUri": "https://acct.queue.core.windows.net",
            "ApprovalStorage__credential": "managedidentity",
            "ApprovalStorage__clientId": "1234",
        }
    )
    assert isinstance(svc.store.service.credential, ManagedIdentityCredential)
    with pytest.raises(SettingsError, match="ApprovalStorage__tableServiceUri"):
        CentralService.from_settings({})
    with pytest.raises(ValueError, match="ALERT_WEBHOOK_FORMAT"):
        CentralService.from_settings(
            {"ApprovalStorage": "UseDevelopmentStorage=true", "ALERT_WEBHOOK_FORMAT": "pager"}
        )


def test_queue_down_loses_no_approval(env: Env, hook: Hook) -> None:
    from azure.storage.queue import QueueServiceClient

    from central.runtime.approval_queue import ApprovalSender

    svc = env.service()
    working = svc.sender
    account = "devstoreaccount1"
    dead = QueueServiceClient.from_connection_string(
        env.conn.replace(env.conn.split("QueueEndpoint=")[1].split(";")[0], f"http://127.0.0.1:9/{account}"),
        retry_total=0,
    )
    svc.sender = ApprovalSender(dead)
    a = Vm("vm-a")
    result = svc.handle_batch(
        [body(a.heartbeat()), body(a.incarnation_env([event("E-qd", ["vm-a"])]))], now=T0
    )
    assert result.approvals_sent == 0 and "not sent" in result.errors[0]
    assert svc.pending()[0]["approvals"] == []
    svc.sender = working  # the queue service is back: the timer sends attempt 1 (its claim was given back)
    decisions = svc.reevaluate(now=T0 + timedelta(seconds=10))
    assert [d.state for d in decisions] == ["approving"]
    (msg,) = env.messages(a.vm_id)
    assert msg["eventId"] == "E-qd"


def test_two_instances_one_approval_one_alert(env: Env, hook: Hook) -> None:
    """Two Function instances (Event Hubs partitions) each see one VM's report of the same event."""
    first, second = env.service(), env.service()
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-multi", ["vm-a", "vm-b"])
    r1 = first.handle_batch([body(a.heartbeat()), body(a.incarnation_env([ev]))], now=T0)
    r2 = second.handle_batch([body(b.heartbeat()), body(b.incarnation_env([ev]))], now=T0)
    assert r1.approvals_sent + r2.approvals_sent == 1
    assert len(env.messages(a.vm_id)) == 1 and env.messages(b.vm_id) == []
    assert len(status_alerts(hook, "E-multi")) == 1
    # the second instance adopted attempt 1 (to vm-a): it tracks it, and fails over only after it expired
    assert second.pending()[0]["leader"]["vmName"] == "vm-a"
    assert second.reevaluate(now=T0 + timedelta(seconds=300)) == []  # a drain's 360 s (hook-then-approve)
    second.handle_batch([body(b.heartbeat(at=T0 + timedelta(seconds=300)))], now=T0 + timedelta(seconds=300))
    decisions = second.reevaluate(now=T0 + timedelta(seconds=361))
    assert [(d.action, d.leader_vm_name) for d in decisions] == [("failover", "vm-b")]
    assert len(env.messages(b.vm_id)) == 1




def test_who_decided_an_approval_result_is_centrals_record_or_the_vms_word_never_a_vm_written_name(
        env: Env, hook: Hook) -> None:
    """"Who acted" comes from a sign-in, never from what a caller writes: a result answering central's
    message records the decider central sent it with, whatever the VM echoes; a result central sent nothing
    for (a local approval on the VM) records the VM, with what it says in brackets, never a bare
    "operator:..." that a VM could pass off as a signed-in person."""
    svc = env.service()
    a, b = Vm("vm-a"), Vm("vm-b")
    svc.handle_batch([body(a.heartbeat()), body(b.heartbeat()),
                      body(a.incarnation_env([event("E-sent", ["vm-a"])])),
                      body(b.incarnation_env([event("E-local", ["vm-b"], "Freeze")]))], now=T0)
    (msg,) = env.messages(a.vm_id)
    echoed = a.result("E-sent", "approved", msg["messageId"], at=T0 + timedelta(seconds=3))
    echoed["data"]["decidedBy"] = "operator:mallory@contoso.com (00000000-0000-0000-0000-000000000001)"
    local = b.result("E-local", "approved", None, at=T0 + timedelta(seconds=3))
    local["data"]["decidedBy"] = "operator:alice@contoso.com (00000000-0000-0000-0000-000000000002)"
    svc.handle_batch([body(echoed), body(local)], now=T0 + timedelta(seconds=4))
    deciders = {r["EventId"]: r["DecidedBy"] for r in env.rows("Decisions") if r["Action"] == "result"}
    assert deciders["E-sent"] == msg["decidedBy"] and not msg["decidedBy"].startswith("operator:")
    assert deciders["E-local"] == ("vm:vm-b (operator:alice@contoso.com "
                                   "(00000000-0000-0000-0000-000000000002))")
    history = svc.event("E-local", now=T0 + timedelta(seconds=5))["decisions"]  # GET /api/events/{id}
    assert [h["decidedBy"] for h in history if h["action"] == "result"] == [deciders["E-local"]]


def test_by_default_a_drain_the_forwarder_allows_finishes_before_its_message_expires(
        env: Env, hook: Hook) -> None:
    """The forwarder lets a pre-approve hook run 300 s (hook_timeout); central's default gives a
    hook-then-approve attempt 360 s before it fails over (APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS), so a
    4-minute drain is not refused as stale while the next VM drains too. Other attempts keep 120 s."""
    svc = env.service()  # APPROVAL_RESULT_TIMEOUT_SECONDS its default, APPROVAL_HOOK_... unset
    a, b, c = Vm("vm-a"), Vm("vm-b"), Vm("vm-c")
    svc.handle_batch([body(a.heartbeat()), body(b.heartbeat()), body(c.heartbeat()),
                      body(a.incarnation_env([event("E-drain", ["vm-a", "vm-b"])])),
                      body(c.incarnation_env([event("E-quick", ["vm-c"], "Freeze", duration=5)]))], now=T0)
    (drain,) = env.messages(a.vm_id)
    (quick,) = env.messages(c.vm_id)
    assert drain["action"] == "hook-then-approve" and quick["action"] == "approve"
    assert parse(drain["expiresAt"]) - T0 == timedelta(seconds=360)
    assert parse(quick["expiresAt"]) - T0 == timedelta(seconds=120)
    for vm in (a, b, c):  # still live at four minutes
        svc.handle_batch([body(vm.heartbeat(at=T0 + timedelta(minutes=4)))], now=T0 + timedelta(minutes=4))
    # at 245 s the 120 s attempt has failed over; the drain's has not
    assert [d.event_id for d in svc.reevaluate(now=T0 + timedelta(seconds=245))] == ["E-quick"]
    late = a.result("E-drain", "approved", drain["messageId"], at=T0 + timedelta(seconds=250))
    svc.handle_batch([body(late)], now=T0 + timedelta(seconds=251))
    assert env.messages(b.vm_id) == []  # nobody else drained
    view = svc.event("E-drain", now=T0 + timedelta(seconds=252))
    assert [a["result"] for a in view["approvals"]] == ["approved"]


def test_a_result_arriving_after_its_event_ended_still_names_centrals_decider(env: Env, hook: Hook) -> None:
    """Batches cross: the VM's approval result can reach central after its report that the event is gone.
    The ended record still holds the attempt it answers: the row names central's decider, not the VM's
    word (the demo's scene a met this)."""
    svc = env.service()
    a = Vm("vm-a")
    svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-late", ["vm-a"])]))], now=T0)
    (msg,) = env.messages(a.vm_id)
    gone = T0 + timedelta(seconds=5)
    svc.handle_batch([body(a.incarnation_env([], at=gone))], now=gone)
    assert svc.state.find_event("E-late")[1] is False  # ended
    late = a.result("E-late", "approved", msg["messageId"], at=T0 + timedelta(seconds=3))
    late["data"]["decidedBy"] = "operator:mallory"
    svc.handle_batch([body(late)], now=T0 + timedelta(seconds=6))
    (row,) = [r for r in env.rows("Decisions") if r["Action"] == "result"]
    assert row["DecidedBy"] == msg["decidedBy"] == "policy:default:impactful"
