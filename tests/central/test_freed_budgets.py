"""A freed budget slot goes to the next waiting event in the call that freed it (issue 24): the ingest
commit that ends an event (or records a refused approval) decides, in the same transaction, the events a
disruption budget held back in the same group, first seen first. On Azurite, with the real store code;
no timer runs in these tests."""

from __future__ import annotations

import json
from datetime import timedelta

from central.model.vms import VmState
from central.policy.budgets import Budget, groups_of, next_waiters
from central.runtime.service import CentralService
from central.store.changes import Changes

from .conftest import Env, Hook
from .factory import T0, Vm, body, event
from .test_head_commits import state_row

ONE_PER_SET = json.dumps({"version": 1, "budgets": {"per-set": {"groupBy": "scaleSet", "maxImpacted": 1}},
                          "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]},
                                     "action": "approve"}]})


def states(svc: CentralService) -> dict:
    return {p["eventId"]: p["state"] for p in svc.pending()}


def head_seq(env: Env) -> int:
    return int(state_row(env, "head")["Seq"])


def waves(svc: CentralService) -> tuple:
    """web-a approved, web-b and web-c waiting in scale set web (budget 1), db-d approved in its own."""
    a, b, c, d = (Vm("web-a", scale_set="web"), Vm("web-b", scale_set="web"), Vm("web-c", scale_set="web"),
                  Vm("db-d", scale_set="db"))
    first = svc.handle_batch([body(v.heartbeat()) for v in (a, b, d)]
                             + [body(a.incarnation_env([event("E-a", ["web-a"])])),
                                body(b.incarnation_env([event("E-b", ["web-b"])])),
                                body(d.incarnation_env([event("E-d", ["db-d"])]))], now=T0)
    assert first.approvals_sent == 2
    later = T0 + timedelta(seconds=5)
    svc.handle_batch([body(c.heartbeat(later)), body(c.incarnation_env([event("E-c", ["web-c"])], later))],
                     now=later)
    assert states(svc) == {"E-a": "approving", "E-b": "waiting-budget", "E-c": "waiting-budget",
                           "E-d": "approving"}
    return a, b, c, d


def test_the_call_that_ends_an_event_approves_the_next_one_waiting_in_its_group(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=ONE_PER_SET)
    a, b, c, _ = waves(svc)
    seq = head_seq(env)

    gone = T0 + timedelta(seconds=30)
    ended = svc.handle_batch([body(a.incarnation_env([], gone))], now=gone)

    # E-b (first seen first) got the slot in this call, E-c still waits, and it took one head commit
    assert [(d.event_id, d.action) for d in ended.decisions] == [("E-b", "approve")]
    assert ended.approvals_sent == 1 and len(env.messages(b.vm_id)) == 1 and not env.messages(c.vm_id)
    assert states(svc) == {"E-b": "approving", "E-c": "waiting-budget", "E-d": "approving"}
    assert head_seq(env) == seq + 1 and ended.conflicts == 0
    # a second instance sees the same state from the store
    other = env.service(POLICY_JSON=ONE_PER_SET)
    other.state.refresh()
    assert states(other) == states(svc)


def test_a_refused_approval_frees_the_slot_too(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=ONE_PER_SET)
    a, b, c, _ = waves(svc)
    (message,) = env.messages(a.vm_id)
    at = T0 + timedelta(seconds=10)
    refused = svc.handle_batch([body(a.result("E-a", "rejected", message["messageId"], at))], now=at)
    assert [(d.event_id, d.action) for d in refused.decisions if d.event_id != "E-a"] == [("E-b", "approve")]
    assert len(env.messages(b.vm_id)) == 1 and not env.messages(c.vm_id)


def test_an_event_ending_in_another_group_lets_no_one_go(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=ONE_PER_SET)
    _, b, c, d = waves(svc)
    gone = T0 + timedelta(seconds=30)
    ended = svc.handle_batch([body(d.incarnation_env([], gone))], now=gone)
    assert ended.decisions == [] and not env.messages(b.vm_id) and not env.messages(c.vm_id)
    assert states(svc) == {"E-a": "approving", "E-b": "waiting-budget", "E-c": "waiting-budget"}


def test_slots_freed_in_two_groups_in_one_call_go_to_a_waiter_of_each(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=ONE_PER_SET)
    a, b, c, d = waves(svc)
    e = Vm("db-e", scale_set="db")
    later = T0 + timedelta(seconds=10)
    svc.handle_batch([body(e.heartbeat(later)), body(e.incarnation_env([event("E-e", ["db-e"])], later))],
                     now=later)
    assert states(svc)["E-e"] == "waiting-budget"

    gone = T0 + timedelta(seconds=30)
    ended = svc.handle_batch([body(a.incarnation_env([], gone)), body(d.incarnation_env([], gone))], now=gone)

    # web's slot to E-b (its oldest waiter), db's to E-e: not both to web's two oldest (E-b, E-c)
    assert sorted((x.event_id, x.action) for x in ended.decisions) == [("E-b", "approve"), ("E-e", "approve")]
    assert states(svc) == {"E-b": "approving", "E-c": "waiting-budget", "E-e": "approving"}
    assert len(env.messages(b.vm_id)) == len(env.messages(e.vm_id)) == 1 and not env.messages(c.vm_id)


def test_the_timer_reads_no_vm_rows_for_events_whose_verdict_stays(env: Env, hook: Hook) -> None:
    """The timer's pass screens every active event on this instance's cached VM rows (live ones: a fresh
    read would say the same) and reads fresh rows only for the events whose verdict changes."""
    svc = env.service(POLICY_JSON=ONE_PER_SET)
    vms = [Vm(f"web-{i}", scale_set="web") for i in range(30)]
    svc.handle_batch([body(v.heartbeat()) for v in vms]
                     + [body(v.incarnation_env([event(f"E-{i:02d}", [v.name])])) for i, v in enumerate(vms)],
                     now=T0)
    assert sorted(states(svc).values()).count("waiting-budget") == 29
    read_names: list = []
    real = svc.state.vms_by_name
    svc.state.vms_by_name = lambda names: read_names.extend(names) or real(names)  # type: ignore[method-assign]
    assert svc.reevaluate(now=T0 + timedelta(seconds=60)) == []
    assert read_names == []  # before: all 30 VMs' rows, every minute
    # the approval runs out unanswered: the timer fails over on fresh rows, and the budget holds the rest
    later = T0 + timedelta(minutes=3)
    svc.handle_batch([body(v.heartbeat(later)) for v in vms], now=later)
    decided = svc.reevaluate(now=later + timedelta(seconds=1))
    assert [(d.event_id, d.action) for d in decided] == [("E-00", "failover")]
    assert "web-0" in read_names  # the decision that commits was taken on its VM's fresh row
    assert len(env.messages(vms[0].vm_id)) == 2


def test_each_freed_vm_lets_go_the_first_waiter_of_its_own_groups_for_every_budget_kind() -> None:
    per_set, per_zone = Budget("s", "scaleSet", "", 1), Budget("z", "zone", "", 1)
    web1 = VmState("1", "web-1", scale_set="web", zone="1")
    web2 = VmState("2", "web-2", scale_set="web", zone="2")
    db2 = VmState("3", "db-3", scale_set="db", zone="2")
    lone = VmState("4", "lone")
    web3 = VmState("5", "web-3", scale_set="web", zone="3")
    db4 = VmState("6", "db-4", scale_set="db", zone="3")

    def chosen(budgets: list, freed: list) -> list:
        waiting = [(e, groups_of(budgets, [vm]))
                   for e, vm in (("E-db", db2), ("E-web", web2), ("E-lone", lone), ("E-web3", web3))]
        return next_waiters([groups_of(budgets, [vm]) for vm in freed], waiting)

    assert groups_of([per_set, per_zone], [web1]) == {"s:web", "z:1"}
    assert chosen([per_set], [web1]) == ["E-web"]
    assert chosen([per_zone], [web1]) == []
    assert chosen([per_set, per_zone], [VmState("7", "x", scale_set="web", zone="2")]) == ["E-db"]
    # one slot per freed VM, each to a waiter of its own groups: not both to the oldest waiters of one
    assert chosen([per_set], [web1, db4]) == ["E-web", "E-db"]
    assert chosen([per_set], [web1, VmState("8", "web-8", scale_set="web")]) == ["E-web", "E-web3"]
    assert chosen([], [web1]) == [] and chosen([per_set], [lone]) == []


def offered(svc: CentralService) -> list:
    """The ids of the events each later deciding pass of `svc` is given, in order."""
    decided: list = []
    real = svc.evaluator.decide_pass

    def spy(found: list, *rest: object) -> object:
        decided.extend(r.event_id for r in found)
        return real(found, *rest)  # type: ignore[arg-type]

    svc.evaluator.decide_pass = spy  # type: ignore[method-assign]
    return decided


def test_waiting_events_are_indexed_by_group_between_calls(env: Env, hook: Hook) -> None:
    """Freeing a slot asks which events wait in the freed groups: an index kept between calls answers (a
    100k wave has thousands waiting), brought up to date from the events the cache says changed."""
    svc = env.service(POLICY_JSON=ONE_PER_SET)
    a, _, _, d = waves(svc)
    gone = T0 + timedelta(seconds=30)
    svc.handle_batch([body(a.incarnation_env([], gone))], now=gone)  # E-b takes web's slot: E-c still waits
    index = svc.evaluator.waiting_groups
    assert index.by_group["per-set:web"] >= {"E-c"} and index.by_event["E-c"] == {"per-set:web"}

    decided = offered(svc)
    # what is indexed is what is used: E-c, indexed as db's, is offered the slot db-d frees (its decision,
    # on its real VM, still waits for web's)
    index.by_event["E-c"] = frozenset({"per-set:db"})
    index.by_group.setdefault("per-set:db", set()).add("E-c")
    later = gone + timedelta(seconds=5)
    svc.handle_batch([body(d.incarnation_env([], later))], now=later)
    assert decided == ["E-c"] and states(svc)["E-c"] == "waiting-budget"


def test_an_event_the_cache_saw_change_is_indexed_again(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=ONE_PER_SET)
    a, _, c, d = waves(svc)
    gone = T0 + timedelta(seconds=30)
    svc.handle_batch([body(a.incarnation_env([], gone))], now=gone)  # builds the index; E-b approved
    index = svc.evaluator.waiting_groups
    index.by_event["E-c"] = frozenset({"per-set:db"})  # wrong, as if indexed from another row
    index.by_group.setdefault("per-set:db", set()).add("E-c")
    rec, _ = svc.state.active["E-c"]
    svc.state.active["E-c"] = (rec, 'W/"a-newer-row"')  # its row changed (re-read, or committed)
    decided = offered(svc)
    later = gone + timedelta(seconds=5)
    ended = svc.handle_batch([body(d.incarnation_env([], later))], now=later)
    assert decided == [] and ended.decisions == [] and not env.messages(c.vm_id)
    assert index.by_event["E-c"] == {"per-set:web"} and "E-c" not in index.by_group.get("per-set:db", set())
    # a reload reads every active row but takes the unchanged ones as cached (not parsed, not indexed
    # again: the timer's reloads in a wave re-indexed thousands of waiting events); a changed one is both
    svc.state.refresh(force=True)  # (E-c's row as stored again: its cached ETag above was made up)
    kept, changed_row = svc.state.active["E-c"], svc.state.active["E-b"]
    other = env.service()
    other.state.refresh()
    mine = other.state.active["E-b"][0]
    mine.description = "rewritten by another instance"
    other.state.commit(Changes(events={"E-b": mine}), later)
    svc.state.active.take_changed()
    svc.state.refresh(force=True)
    assert svc.state.active["E-c"] is kept and svc.state.active["E-b"][1] != changed_row[1]
    assert svc.state.active.take_changed() == {"E-b"}


def test_the_cache_records_which_events_changed_for_the_index() -> None:
    from central.model.events import EventRecord
    from central.store.active_events import ActiveEvents

    active = ActiveEvents()
    rec = EventRecord(event_id="E-1", first_seen=T0)
    active["E-1"] = (rec, 'W/"1"')
    assert active.take_changed() is None  # a new cache: every entry is new to a follower
    active["E-1"] = (rec, 'W/"1"')  # the same row read again
    assert active.take_changed() == set()
    active["E-1"] = (rec, 'W/"2"')
    active["E-2"] = (rec, 'W/"1"')
    active.pop("E-3", None)
    assert active.take_changed() == {"E-1", "E-2", "E-3"}
    del active["E-2"]
    assert active.take_changed() == {"E-2"} and list(active) == ["E-1"]
    for n in range(1100):  # events come and go, unread for long: the follower is told to look at everything
        active[f"X-{n}"] = (rec, 'W/"1"')
        active.pop(f"X-{n}")
    assert active.take_changed() is None and active.take_changed() == set()


def test_the_cache_knows_which_events_owe_alerts() -> None:
    """Delivering looks at the events whose rows owe alerts, not at every active event of a wave."""
    from central.model.events import EventRecord
    from central.store.active_events import ActiveEvents

    active = ActiveEvents()
    quiet, owing = EventRecord(event_id="E-1", first_seen=T0), EventRecord(event_id="E-2", first_seen=T0)
    owing.pending_alerts = [{"key": "E-2:status"}]
    active["E-1"], active["E-2"], active["E-3"] = (quiet, 'W/"1"'), (owing, 'W/"1"'), (owing, 'W/"1"')
    assert list(active.owing) == ["E-2", "E-3"]
    active["E-2"] = (quiet, 'W/"2"')  # settled
    del active["E-3"]
    assert list(active.owing) == []
    active["E-1"] = (owing, 'W/"2"')
    active.replace_all({"E-2": (owing, 'W/"3"')})  # a reload: E-1 is gone, E-2 owes now
    assert list(active.owing) == ["E-2"]
