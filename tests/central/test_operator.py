"""The operator's calls (issue 11, item 3) on a real CentralService on Azurite: one event with its history,
approve with the drain hook, hold and release, EventIds in any case, one decidedBy form, and every
operator decision logged and alerted (who, what, why)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest

from central.runtime.results import InvalidRequest, UnknownEvent

from .conftest import Env, Hook
from .factory import T0, Vm, body, event

WINDOWED = {
    "version": 1,
    "windows": {"night": {"timeZone": "UTC", "start": "02:00", "end": "04:00"}},
    "rules": [{"name": "redeploy-at-night", "match": {"eventTypes": ["Redeploy"]},
               "action": "approve-in-window", "window": "night"}],
}
APPROVE = {"version": 1,
           "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}]}
EVENT_ID = "5DD55C7F-B5C3-4D2E-9F2C-3A0B3C6A1E01"  # Azure's form: an upper-case GUID


def scheduled(env: Env, policy: dict, kind: str = "Reboot") -> tuple:
    svc = env.service(POLICY_JSON=json.dumps(policy))
    vm = Vm("vm-a")
    nb = T0 + timedelta(hours=20)
    svc.handle_batch([body(vm.heartbeat()), body(vm.incarnation_env([event(EVENT_ID, ["vm-a"], kind,
                                                                            not_before=nb)]))], now=T0)
    return svc, vm


def test_one_event_with_its_history_in_any_case(env: Env, hook: Hook) -> None:
    svc, vm = scheduled(env, APPROVE)
    (message,) = env.messages(vm.vm_id)
    svc.handle_batch([body(vm.result(EVENT_ID, "approved", message["messageId"]))], now=T0)
    view = svc.event(EVENT_ID.lower(), now=T0)
    assert view["eventId"] == EVENT_ID and view["outcome"] == "approved"
    assert [(d["action"], d["state"]) for d in view["decisions"]] == [("approve", "approving"),
                                                                      ("result", "approved")]
    decision = view["decisions"][0]
    assert decision["rule"] == "reboots" and decision["decidedBy"] == "policy:reboots"
    assert decision["messageId"] == message["messageId"] and decision["shadow"] is False
    # ended events too, any time later
    later = T0 + timedelta(days=3)
    svc.handle_batch([body(vm.incarnation_env([], at=later))], now=later)
    assert svc.event(EVENT_ID, now=later)["status"] == "Cancelled"
    with pytest.raises(UnknownEvent):
        svc.event("NO-SUCH-EVENT")


def test_approve_with_the_drain_hook(env: Env, hook: Hook) -> None:
    svc, vm = scheduled(env, WINDOWED, "Redeploy")
    assert env.messages(vm.vm_id) == []  # waiting for the night window
    view = svc.decide(EVENT_ID.lower(), "approve", "alice", "drain first, then go", now=T0, hook=True)
    (message,) = env.messages(vm.vm_id)
    assert message["action"] == "hook-then-approve" and message["decidedBy"] == "operator:alice"
    assert view["decision"]["rule"] == "operator" and view["decision"]["decidedBy"] == "operator:alice"


def test_hold_then_release_lets_the_policy_decide_again(env: Env, hook: Hook) -> None:
    svc, vm = scheduled(env, WINDOWED, "Redeploy")
    held = svc.decide(EVENT_ID, "hold", "bob", "change freeze", now=T0)
    assert held["operatorHold"] and held["decision"]["rule"] == "operator"
    assert held["decision"]["decidedBy"] == "operator:bob"
    with pytest.raises(InvalidRequest, match="goes with approve only"):
        svc.decide(EVENT_ID, "hold", "bob", "x", now=T0, hook=True)
    night = T0.replace(hour=2, minute=30) + timedelta(days=1)
    svc.handle_batch([body(vm.heartbeat(at=night))], now=night)  # alive: it could lead
    svc.reevaluate(now=night)
    assert env.messages(vm.vm_id) == []  # the window is open, but the hold binds
    released = svc.decide(EVENT_ID, "release", "bob", "freeze over", now=night)
    assert not released["operatorHold"] and released["state"] == "approving"  # decided again at once
    assert len(env.messages(vm.vm_id)) == 1
    with pytest.raises(InvalidRequest, match="no operator holds it"):
        svc.decide(EVENT_ID, "release", "bob", "again", now=night)
    actions = [d["action"] for d in svc.event(EVENT_ID, now=night)["decisions"]]
    assert actions == ["approve-in-window", "operator-hold", "operator-release", "approve-in-window"]


def test_a_hold_repeating_the_last_decision_still_binds(env: Env, hook: Hook) -> None:
    """hold, approve (an approval is outstanding: it only lifts the hold), hold again with the same reason:
    the second hold repeats the event's last decision word for word, and must bind all the same (found by
    tests/central_multi/test_interleavings.py: the policy failed over to a second approval after it)."""
    svc, vm = scheduled(env, APPROVE)
    assert len(env.messages(vm.vm_id)) == 1  # attempt 1 outstanding
    svc.decide(EVENT_ID, "hold", "dan", "freeze", now=T0 + timedelta(seconds=1))
    lifted = svc.decide(EVENT_ID, "approve", "dan", "go", now=T0 + timedelta(seconds=2))
    assert not lifted["operatorHold"]
    again = svc.decide(EVENT_ID, "hold", "dan", "freeze", now=T0 + timedelta(seconds=3))
    assert again["operatorHold"] and again["decision"]["action"] == "operator-hold"
    later = T0 + timedelta(minutes=10)  # attempt 1 expired unanswered: failover, were it not held
    svc.handle_batch([body(vm.heartbeat(at=later))], now=later)
    svc.reevaluate(now=later)
    assert len(env.messages(vm.vm_id)) == 1
    holds = [d for d in svc.event(EVENT_ID, now=later)["decisions"] if d["action"] == "operator-hold"]
    assert len(holds) == 2  # every operator decision is recorded, a repeated one too


def test_a_repeated_verdict_is_new_only_when_a_person_took_it() -> None:
    from central.model.events import EventRecord
    from central.policy.verdict import Verdict, is_new

    rec = EventRecord(EVENT_ID, T0, state="held", decision={"reason": "freeze"})
    assert not is_new(rec, Verdict("record", "hold", "held", "r", "freeze", decided_by="policy:r"))
    for person in ("operator:dan", "key:ci"):
        hold = Verdict("record", "operator-hold", "held", "operator", "freeze", decided_by=person)
        assert is_new(rec, hold)
    assert not is_new(rec, Verdict("none", decided_by="operator:dan"))


def test_every_operator_decision_is_logged_and_alerted(
    env: Env, hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    svc, _ = scheduled(env, WINDOWED, "Redeploy")
    with caplog.at_level(logging.WARNING, logger="central.service"):
        svc.decide(EVENT_ID, "hold", "carol", "audit pending", now=T0)
        svc.decide(EVENT_ID, "approve", "carol", "audit done", now=T0 + timedelta(seconds=5))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("se.operator ")]
    head = f"se.operator eventId={EVENT_ID}"
    assert lines == [f"{head} action=operator-hold operator=carol reason=audit pending",
                     f"{head} action=operator-approve operator=carol reason=audit done"]
    alerts = [a for a in hook.alerts() if a["kind"] == "operator-decision"]
    assert [(a["facts"]["operator"], a["facts"]["action"], a["facts"]["reason"]) for a in alerts] == [
        ("carol", "hold", "audit pending"), ("carol", "approve", "audit done")]
    assert all(a["eventId"] == EVENT_ID for a in alerts)


def test_refusals_say_why(env: Env, hook: Hook) -> None:
    svc, vm = scheduled(env, APPROVE)
    with pytest.raises(InvalidRequest, match="must be one of approve, hold, release"):
        svc.decide(EVENT_ID, "cancel", "dave", "x", now=T0)
    with pytest.raises(UnknownEvent):
        svc.decide("NOPE", "hold", "dave", "x", now=T0)
    later = T0 + timedelta(minutes=1)
    svc.handle_batch([body(vm.incarnation_env([], at=later))], now=later)
    with pytest.raises(InvalidRequest, match="has ended"):
        svc.decide(EVENT_ID, "hold", "dave", "too late", now=later)
