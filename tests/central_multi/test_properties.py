"""Issue 10's properties, one test each, with three or more central instances on one Azurite: each VM's
envelopes reach one instance (its partition's owner), timer and HTTP calls land on others."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from central.runtime.results import BatchResult
from central.runtime.webhook import idempotency_key

from ..central.conftest import Env, Hook
from ..central.factory import T0, Vm, body, event

BUDGET = {
    "version": 1,
    "budgets": {"per-scale-set": {"groupBy": "scaleSet", "maxImpacted": 1}},
    "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}],
}
WINDOW = {
    "version": 1,
    "windows": {"evening": {"timeZone": "UTC", "start": "18:00", "end": "20:00"}},
    "rules": [
        {
            "name": "in-window",
            "match": {"eventTypes": ["Redeploy"]},
            "action": "approve-in-window",
            "window": "evening",
        }
    ],
}


def sent(env: Env, *vms: Vm) -> int:
    return sum(len(env.messages(vm.vm_id)) for vm in vms)


def test_a_budget_counts_the_events_of_the_whole_fleet(env: Env, hook: Hook, fleet_of) -> None:
    """Two VMs of one scale set on two instances, budget 1: never both approved at once."""
    inst = fleet_of(3, POLICY_JSON=json.dumps(BUDGET))
    a, b = Vm("web_0", scale_set="web"), Vm("web_1", scale_set="web")
    ea, eb = event("E-ba", ["web_0"]), event("E-bb", ["web_1"])
    inst[0].handle_batch([body(a.heartbeat()), body(a.incarnation_env([ea]))], now=T0)
    inst[1].handle_batch([body(b.heartbeat()), body(b.incarnation_env([eb]))], now=T0)
    assert sent(env, a, b) == 1 and len(env.messages(a.vm_id)) == 1
    states = {p["eventId"]: p["state"] for p in inst[2].pending()}
    assert states == {"E-ba": "approving", "E-bb": "waiting-budget"}
    inst[2].reevaluate(now=T0 + timedelta(seconds=5))  # a third instance's timer: still one
    assert sent(env, a, b) == 1
    # web_0's event ends, reported to its own instance, which never saw web_1: the call that ends it hands
    # the slot to E-bb at once (its VM row read by key), and another instance's timer finds nothing to do
    later = T0 + timedelta(seconds=30)
    assert inst[0].state.vm(b.vm_id) is None  # (what "never saw" means here: no row of web_1 cached)
    freed = inst[0].handle_batch([body(a.heartbeat(at=later)), body(a.incarnation_env([], at=later))],
                                 now=later)
    assert [(d.event_id, d.state) for d in freed.decisions] == [("E-bb", "approving")]
    assert len(env.messages(b.vm_id)) == 1
    assert inst[2].reevaluate(now=later + timedelta(seconds=1)) == []
    assert len(env.messages(b.vm_id)) == 1


def test_an_operator_hold_on_any_instance_binds_the_instance_owning_the_vm(
    env: Env, hook: Hook, fleet_of
) -> None:
    inst = fleet_of(3, POLICY_JSON=json.dumps(WINDOW))
    a = Vm("vm-a")
    nb = T0 + timedelta(hours=8)
    inst[0].handle_batch(
        [body(a.heartbeat()), body(a.incarnation_env([event("E-h", ["vm-a"], "Redeploy", not_before=nb)]))],
        now=T0,
    )
    assert inst[0].pending()[0]["state"] == "waiting-window"
    view = inst[2].decide("E-h", "hold", "alice", "change freeze")  # an instance that never saw it
    assert view["operatorHold"] is True
    opens = T0.replace(hour=18, minute=0)
    for i, instance in enumerate(inst.all):  # every instance's timer, the window open
        instance.handle_batch([body(a.heartbeat(at=opens))], now=opens) if i == 0 else None
        assert instance.reevaluate(now=opens + timedelta(seconds=i)) == []
    assert env.messages(a.vm_id) == []
    assert all(i.pending()[0]["state"] == "held" for i in inst.all)


def test_operator_routes_answer_from_the_shared_state_on_an_instance_without_envelopes(
    env: Env, hook: Hook, fleet_of
) -> None:
    inst = fleet_of(
        3, POLICY_JSON=json.dumps({"version": 1, "rules": [{"name": "manual", "action": "hold"}]})
    )
    a, b = Vm("vm-a"), Vm("vm-b")
    inst[0].handle_batch(
        [body(a.heartbeat()), body(a.incarnation_env([event("E-op", ["vm-a", "vm-b"])]))], now=T0
    )
    inst[1].handle_batch(
        [body(b.heartbeat()), body(b.incarnation_env([event("E-op", ["vm-a", "vm-b"])]))], now=T0
    )
    fresh = inst[2]
    (view,) = fresh.pending()
    assert view["eventId"] == "E-op" and sorted(view["reportedBy"]) == ["vm-a", "vm-b"]
    health = fresh.health(now=T0)
    assert health["knownVms"] == 2 and health["openEvents"] == 1 and health["status"] == "ok"
    approved = fresh.decide("E-op", "approve", "bob", "agreed", now=T0 + timedelta(seconds=2))
    assert approved["leader"]["vmName"] == "vm-a" and len(env.messages(a.vm_id)) == 1
    assert inst[0].pending()[0]["state"] == "approving"  # the owner sees it at once
    assert fresh.event("E-op")["approvals"][0]["decidedBy"] == "operator:bob"


def test_a_vm_seen_alive_by_any_instance_is_alive_for_all(env: Env, hook: Hook, fleet_of) -> None:
    """vm-a (first in Resources) heartbeats to instance 0 only; the event reaches instance 1 from vm-b:
    instance 1 elects vm-a, live by what instance 0 saw."""
    inst = fleet_of(3)
    a, b = Vm("vm-a"), Vm("vm-b")
    inst[0].handle_batch([body(a.heartbeat())], now=T0)
    ev = event("E-live", ["vm-a", "vm-b"])
    inst[1].handle_batch([body(b.heartbeat()), body(b.incarnation_env([ev]))], now=T0 + timedelta(seconds=1))
    assert len(env.messages(a.vm_id)) == 1 and env.messages(b.vm_id) == []
    assert inst[2].pending()[0]["leader"]["vmName"] == "vm-a"


def test_failover_and_expiry_run_on_the_shared_state_anywhere(env: Env, hook: Hook, fleet_of) -> None:
    inst = fleet_of(3, APPROVAL_RESULT_TIMEOUT_SECONDS="60", APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS="60")
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-fo", ["vm-a", "vm-b"], not_before=T0 + timedelta(minutes=10))
    inst[0].handle_batch([body(a.heartbeat()), body(a.incarnation_env([ev]))], now=T0)
    inst[1].handle_batch([body(b.heartbeat()), body(b.incarnation_env([ev]))], now=T0)
    assert len(env.messages(a.vm_id)) == 1
    later = T0 + timedelta(seconds=61)
    inst[1].handle_batch([body(b.heartbeat(at=later))], now=later)
    decisions = inst[2].reevaluate(now=later)  # an instance that never saw the event
    assert [(d.action, d.leader_vm_name) for d in decisions] == [("failover", "vm-b")]
    assert inst[0].reevaluate(now=later + timedelta(seconds=1)) == []  # no second failover elsewhere
    assert len(env.messages(b.vm_id)) == 1
    expired = inst[1].reevaluate(now=T0 + timedelta(minutes=11))
    assert [d.state for d in expired] == ["expired"]
    assert inst[2].reevaluate(now=T0 + timedelta(minutes=12)) == []


def test_instances_racing_on_one_decision_end_with_one_outcome(env: Env, hook: Hook, fleet_of) -> None:
    inst = fleet_of(4, POLICY_JSON=json.dumps(WINDOW))
    a = Vm("vm-a")
    inst[0].handle_batch(
        [
            body(a.heartbeat()),
            body(
                a.incarnation_env([event("E-race", ["vm-a"], "Redeploy", not_before=T0 + timedelta(hours=8))])
            ),
        ],
        now=T0,
    )
    opens = T0.replace(hour=18, minute=0)
    inst[0].handle_batch([body(a.heartbeat(at=opens))], now=opens)
    results: list = []
    start = threading.Barrier(len(inst.all))

    def timer(i: int) -> None:
        start.wait()
        results.append(inst[i].reevaluate(now=opens + timedelta(seconds=1)))

    threads = [threading.Thread(target=timer, args=(i,)) for i in range(len(inst.all))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(len(r) for r in results) == [0, 0, 0, 1]  # exactly one instance decided
    assert len(env.messages(a.vm_id)) == 1
    assert len(inst[3].pending()[0]["approvals"]) == 1


class Crash(BaseException):
    """SIGKILL inside one process: nothing in central catches a BaseException."""


def test_an_alert_is_never_lost_to_a_crash_between_its_commit_and_its_post(
    env: Env, hook: Hook, fleet_of
) -> None:
    inst = fleet_of(3)
    a = Vm("vm-a")

    def die(alert):
        raise Crash

    inst[0].actor.alerter.send = die
    with pytest.raises(Crash):
        inst[0].handle_batch(
            [body(a.heartbeat()), body(a.incarnation_env([event("E-crash", ["vm-a"])]))], now=T0
        )
    assert hook.alerts() == []
    assert inst[1].reevaluate(now=T0 + timedelta(seconds=30)) == [] and hook.alerts() == []  # leased
    inst[2].reevaluate(now=T0 + timedelta(seconds=61))  # the lease is over: any instance delivers it
    (entry,) = hook.entries()
    assert entry["body"]["key"] == "E-crash:Scheduled"
    assert (
        entry["idempotencyKey"] == entry["body"]["idempotencyKey"] == idempotency_key_of("E-crash:Scheduled")
    )
    inst[1].reevaluate(now=T0 + timedelta(seconds=200))  # (vm-a's approval has expired unanswered by now)
    assert [e["body"]["key"] for e in hook.entries()].count("E-crash:Scheduled") == 1


def idempotency_key_of(key: str) -> str:
    from central.model.alert import Alert

    return idempotency_key(Alert(key, "event-status", "", "", "", T0))


def test_alerts_waiting_for_a_retry_survive_a_restart(env: Env, hook: Hook, fleet_of) -> None:
    hook.fail_next(3)
    first = fleet_of(1, ALERT_MAX_ATTEMPTS="3")[0]
    a = Vm("vm-a")
    result: BatchResult = first.handle_batch(
        [body(a.heartbeat()), body(a.incarnation_env([event("E-keep", ["vm-a"])]))], now=T0
    )
    assert result.alerts_failed == 1 and hook.alerts() == []
    del first  # the instance goes away with whatever it had in memory
    replacement = env.service(ALERT_MAX_ATTEMPTS="3")
    replacement.reevaluate(now=T0 + timedelta(seconds=30))
    assert [x["key"] for x in hook.alerts()] == ["E-keep:Scheduled"]
    rows = {r["Key"]: r for r in env.rows("Alerts")}
    assert rows["E-keep:Scheduled"]["Sent"] is True and rows["E-keep:Scheduled"]["Rounds"] == 2


def test_a_late_report_about_an_event_that_ended_long_ago_is_recognised(
    env: Env, hook: Hook, fleet_of
) -> None:
    inst = fleet_of(3)
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-late", ["vm-a", "vm-b"], source="User")
    inst[0].handle_batch(
        [body(a.heartbeat()), body(a.incarnation_env([ev])), body(a.incarnation_env([]))], now=T0
    )
    assert inst[0].pending() == [] and env.rows("Events")[0]["Status"] == "Cancelled"
    alerts_before = len(hook.alerts())
    three_days = T0 + timedelta(days=3)
    # vm-b's copy arrives three days later at another (fresh) instance
    late = inst[1].handle_batch([body(b.incarnation_env([ev], at=T0))], now=three_days)
    assert late.late == 1 and late.decisions == [] and late.approvals_sent == 0
    assert inst[2].pending() == [] and len(hook.alerts()) == alerts_before
    assert inst[2].event("E-late")["status"] == "Cancelled"


def dies_before_sending(instance, event_id: str) -> Vm:
    """`instance` commits the approval attempt of a new event of web_0 and dies before the queue send."""
    a = Vm("web_0", scale_set="web")

    def die(*args, **kwargs):
        raise Crash

    instance.actor.sender.send = die
    with pytest.raises(Crash):
        instance.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event(event_id, ["web_0"])]))],
                              now=T0)
    return a


def test_a_hold_revokes_an_approval_whose_instance_died_between_commit_and_send(
    env: Env, hook: Hook, fleet_of
) -> None:
    """Instance 0 commits an approval attempt and dies before the queue send; an operator holds the event
    on instance 1 while the attempt's send lease is live (the answer says it may still be sent, until
    when); once the lease lapses, no instance sends it: the timer revokes it."""
    inst = fleet_of(3, POLICY_JSON=json.dumps(BUDGET))
    a = dies_before_sending(inst[0], "E-rv")
    assert env.messages(a.vm_id) == []
    held = inst[1].decide("E-rv", "hold", "alice", "change freeze", now=T0 + timedelta(seconds=5))
    assert "may still be sent" in held["decision"]["reason"] and held["decision"]["rule"] == "operator"
    assert held["decision"]["decidedBy"] == "operator:alice"
    inst[2].reevaluate(now=T0 + timedelta(seconds=40))  # the lease has lapsed: revoked, not re-sent
    inst[1].reevaluate(now=T0 + timedelta(seconds=400))
    assert env.messages(a.vm_id) == []
    (attempt,) = inst[2].event("E-rv")["approvals"]
    assert attempt["revoked"] and not attempt["sent"] and attempt["result"] == "timeout"


def test_a_hold_after_the_lease_lapsed_revokes_at_once_and_says_so(env: Env, hook: Hook, fleet_of) -> None:
    inst = fleet_of(2, POLICY_JSON=json.dumps(BUDGET))
    a = dies_before_sending(inst[0], "E-rv2")
    held = inst[1].decide("E-rv2", "hold", "bob", "freeze", now=T0 + timedelta(seconds=31))
    reason = held["decision"]["reason"]
    assert "it is revoked (never sent again), yet it may already be in the queue" in reason
    inst[1].reevaluate(now=T0 + timedelta(seconds=60))
    assert env.messages(a.vm_id) == []


def test_an_unheld_approval_whose_instance_died_is_sent_once_by_another(
    env: Env, hook: Hook, fleet_of
) -> None:
    inst = fleet_of(3, POLICY_JSON=json.dumps(BUDGET))
    a = dies_before_sending(inst[0], "E-rs")
    inst[1].reevaluate(now=T0 + timedelta(seconds=10))  # the lease is live: not yet
    assert env.messages(a.vm_id) == []
    threads = [threading.Thread(target=i.reevaluate, kwargs={"now": T0 + timedelta(seconds=35)})
               for i in (inst[1], inst[2])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    (message,) = env.messages(a.vm_id)  # two timers raced for the new lease: one sent it
    (attempt,) = inst[0].event("E-rs")["approvals"]
    assert attempt["sent"] and attempt["messageId"] == message["messageId"]


def test_an_approval_sent_whose_instance_died_before_marking_it_is_sent_again_as_is(
    env: Env, hook: Hook, fleet_of
) -> None:
    """The window of one bookkeeping commit per call (issue 24): the queue send happened, and the instance
    died before the send's mark was committed (with the alerts it settles, after their log rows). The
    attempt's lease lapses and another instance's timer sends the very message again: the VM's queue holds
    it twice under one messageId (the forwarder POSTs an approval once per messageId), and the attempt ends
    marked sent."""
    inst = fleet_of(2, POLICY_JSON=json.dumps(BUDGET))
    a = Vm("web_0", scale_set="web")

    def die(*args, **kwargs):
        raise Crash

    inst[0].actor.logs.flush = die  # after the queue send, before the marks' commit
    with pytest.raises(Crash):
        inst[0].handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-sm", ["web_0"])]))],
                             now=T0)
    (first,) = env.messages(a.vm_id)
    (attempt,) = inst[1].event("E-sm")["approvals"]
    assert not attempt["sent"] and attempt["messageId"] == first["messageId"]
    inst[1].reevaluate(now=T0 + timedelta(seconds=10))  # the dead instance's lease is live: not yet
    assert len(env.messages(a.vm_id)) == 1
    inst[1].reevaluate(now=T0 + timedelta(seconds=35))
    assert env.messages(a.vm_id) == [first, first]
    (attempt,) = inst[1].event("E-sm")["approvals"]
    assert attempt["sent"] and attempt["messageId"] == first["messageId"]


def test_a_batch_retried_after_a_store_failure_is_applied_whole(
    env: Env, hook: Hook, fleet_of, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host retries a failed batch on the same instance: nothing of it may count as a duplicate."""
    from central.store.tables import StoreError

    svc = fleet_of(1)[0]
    a = Vm("vm-r")
    real = svc.state.store.transact
    calls = {"n": 0}

    def fails_once(table, ops):
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreError("Tables unreachable")
        return real(table, ops)

    monkeypatch.setattr(svc.state.store, "transact", fails_once)
    batch = [body(a.heartbeat()), body(a.incarnation_env([event("E-retry", ["vm-r"])]))]
    with pytest.raises(StoreError):
        svc.handle_batch(batch, now=T0)
    again = svc.handle_batch(batch, now=T0)
    assert again.duplicates == 0 and again.processed == 2
    assert [r["EventId"] for r in env.rows("Events")] == ["E-retry"]
    assert svc.handle_batch(batch, now=T0).duplicates == 2  # once committed, a replay is a duplicate


def test_the_fleet_view_is_the_same_on_every_instance(env: Env, hook: Hook, fleet_of) -> None:
    inst = fleet_of(3, POLICY_JSON=json.dumps(BUDGET))
    web, db, gone = Vm("web_0", scale_set="web"), Vm("db_0", scale_set="db"), Vm("old_0", scale_set="db")
    inst[1].handle_batch([body(gone.heartbeat(at=T0 - timedelta(hours=1)))], now=T0 - timedelta(hours=1))
    inst[0].handle_batch([body(web.heartbeat()), body(web.incarnation_env([event("E-f", ["web_0"])]))],
                         now=T0)
    inst[1].handle_batch([body(db.heartbeat(at=T0, dropped=2))], now=T0)
    views = [i.fleet(now=T0 + timedelta(seconds=10)) for i in inst.all]  # inst[2] never saw an envelope
    assert views[0] == views[1] == views[2]
    fleet = views[2]
    assert (fleet["knownVms"], fleet["liveVms"], fleet["silentVms"]) == (3, 2, 1)
    assert [v["name"] for v in fleet["vms"]] == ["old_0", "db_0", "web_0"]  # silent first
    by_name = {v["name"]: v for v in fleet["vms"]}
    assert by_name["old_0"]["silent"] and not by_name["web_0"]["silent"]
    assert by_name["web_0"]["openEvents"] == ["E-f"] and by_name["web_0"]["groups"] == ["per-scale-set:web"]
    assert by_name["db_0"]["outboxDropped"] == 2 and by_name["db_0"]["forwarderVersion"] == "0.1.0"
