"""Issue 23 points 1 and 2: the platform's own feed (Event Grid ScheduledEventEmitted events, as delivered
into central's platform hub) on a real CentralService over Azurite: parsing, dedupe on the Event Grid id,
status only forward, one cancelled spelling, matching Resources to VMs by name for each VM kind, one record
per EventId with the platform's facts outranking a VM's, the exact end, and bad input quarantined."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any, Dict, List, Optional

import pytest

from central.intake import platform

from .conftest import Env, Hook
from .factory import T0, Vm, body, event, rfc1123

SUB, RG = "00000000-0000-0000-0000-000000000001", "rg-fleet"
S = timedelta(seconds=1)


def owner_id(kind: str, name: str, event_id: str) -> str:
    return (f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/{kind}/{name}"
            f"/providers/Microsoft.Maintenance/scheduledevents/{event_id}")


def grid(event_id: str, resources: List[str], status: str = "Scheduled", event_type: str = "Reboot",
         not_before: Optional[datetime] = None, kind: str = "virtualMachines", owner: str = "",
         grid_id: str = "", at: datetime = T0) -> Dict[str, Any]:
    """One Event Grid event as the system topic emits it (platform-feed.md's sample shape)."""
    nb = "" if status in ("Started", "Completed", "Canceled") else rfc1123(not_before or T0 + 15 * 60 * S)
    rid = owner_id(kind, owner or resources[0], event_id)
    return {
        "id": grid_id or str(uuid.uuid4()),
        "topic": f"/subscriptions/{SUB}",
        "subject": rid,
        "data": {"resourceInfo": {
            "id": rid, "name": event_id, "type": "microsoft.maintenance/scheduledEvents",
            "location": "eastus",
            "properties": {"DurationInSeconds": 5, "Description": "Host maintenance", "EventId": event_id,
                           "EventSource": "Platform", "EventStatus": status, "EventType": event_type,
                           "NotBefore": nb, "Resources": resources, "ResourceType": "VirtualMachine",
                           "ScheduledEventApiVersion": "2020-07-01"}},
            "apiVersion": "2024-07-01"},
        "eventType": platform.EMITTED,
        "dataVersion": "3.0", "metadataVersion": "1", "eventTime": at.isoformat(),
    }


def msg(*events: Dict[str, Any]) -> bytes:
    return json.dumps(list(events)).encode()


# ---- parsing (pure) ----------------------------------------------------------------------------------

def test_a_body_is_an_array_or_one_event_and_the_cancelled_spelling_is_one() -> None:
    one = grid("E1", ["vm-a"], "Canceled")
    (parsed,) = platform.parse_body(json.dumps(one))
    assert isinstance(parsed, platform.PlatformEvent)
    assert (parsed.status, parsed.said, parsed.not_before) == ("Cancelled", "Canceled", None)
    both = platform.parse_body(msg(grid("E1", ["vm-a"]), grid("E2", ["vm-b"], "Started")))
    assert [(p.event_id, p.status) for p in both] == [("E1", "Scheduled"), ("E2", "Started")]
    assert both[0].not_before == T0 + 15 * 60 * S


@pytest.mark.parametrize("kind,owner,resources", [
    ("virtualMachines", "web-7", ["web-7"]),  # standalone VM: the VM's own name
    ("virtualMachineScaleSets", "flex", ["flex_3f2a1b9c"]),  # Flexible: each instance is a VM, its name
    ("virtualMachineScaleSets", "uni", ["uni_0", "uni_4"]),  # Uniform: <set>_<instanceId>, IMDS's name
    ("availabilitySets", "avset", ["db-1", "db-2"]),  # availability set: the VMs' names
])
def test_the_owner_is_the_compute_resource_that_acknowledges(kind: str, owner: str,
                                                             resources: List[str]) -> None:
    (parsed,) = platform.parse_body(msg(grid("E1", resources, kind=kind, owner=owner)))
    assert isinstance(parsed, platform.PlatformEvent)
    assert parsed.owner == platform.Owner(SUB, RG, kind, owner)
    assert list(parsed.resources) == sorted(resources)


@pytest.mark.parametrize("doc,why", [
    ("{not json", "not JSON"),
    (json.dumps({"id": "x", "eventType": "Microsoft.Resources.ResourceWriteSuccess", "data": {}}),
     "not a scheduled event"),
    (json.dumps(dict(grid("E1", ["a"]), id="")), "no Event Grid id"),
    (json.dumps(grid("E1", ["a"], "Paused")), "EventStatus 'Paused'"),
    (json.dumps(grid("E1", ["a"], event_type="Explode")), "EventType 'Explode'"),
])
def test_bad_and_unknown_events_are_bad_envelopes(doc: str, why: str) -> None:
    (parsed,) = platform.parse_body(doc)
    assert not isinstance(parsed, platform.PlatformEvent)
    assert why in parsed.errors[0]["message"] and parsed.extra == {"source": "platform"}


# ---- central (Azurite) ------------------------------------------------------------------------------

def test_a_platform_event_names_known_vms_and_the_policy_approves_through_one(env: Env, hook: Hook) -> None:
    svc = env.service()
    a, b = Vm("uni_0", scale_set="uni"), Vm("uni_4", scale_set="uni")
    svc.handle_batch([body(a.heartbeat()), body(b.heartbeat())], now=T0)
    result = svc.handle_platform_batch([msg(grid("E1", ["uni_4", "uni_0"], kind="virtualMachineScaleSets",
                                                 owner="uni"))], now=T0 + S)
    assert result.processed == 1 and result.approvals_sent == 1
    assert len(env.messages(a.vm_id)) == 1  # the first live VM of sorted Resources, matched by name
    view = svc.event("E1", now=T0 + S)
    assert view["witnesses"]["platform"]["owner"]["kind"] == "virtualMachineScaleSets"
    assert view["history"][0]["witness"] == "platform" and view["reportedBy"] == {}
    svc.handle_batch([body(a.incarnation_env([event("E1", ["uni_0", "uni_4"])], at=T0 + 2 * S))],
                     now=T0 + 2 * S)  # uni_0's forwarder reports it too: one record, two witnesses
    fleet = {v["name"]: v["witnesses"] for v in svc.fleet(now=T0 + 2 * S)["vms"]}
    assert fleet == {"uni_0": {"E1": {"platform": "Scheduled", "self": True}},
                     "uni_4": {"E1": {"platform": "Scheduled", "self": False}}}
    assert svc.event("E1")["witnesses"]["vms"] == {"uni_0": a.vm_id}


@pytest.mark.parametrize("platform_first", [False, True])
def test_one_event_stays_one_record_whichever_case_each_witness_spells_its_event_id(
        env: Env, hook: Hook, platform_first: bool) -> None:
    """An EventId is a GUID; IMDS writes it upper-case, Event Grid's own samples lower-case. Either witness
    first, one record with both witnesses (before: two records, each decided, one approval the forwarder's
    gate refused as unknown)."""
    upper = str(uuid.uuid4()).upper()
    svc = env.service()
    vm = Vm("web_7")
    svc.handle_batch([body(vm.heartbeat())], now=T0)
    report = [body(vm.incarnation_env([event(upper, ["web_7"])], at=T0 + S))]
    feed = [msg(grid(upper.lower(), ["web_7"]))]
    if platform_first:
        svc.handle_platform_batch(feed, now=T0 + S)
        svc.handle_batch(report, now=T0 + 2 * S)
    else:
        svc.handle_batch(report, now=T0 + S)
        svc.handle_platform_batch(feed, now=T0 + 2 * S)
    rows = [r for r in env.rows("Events") if r["EventId"].lower() == upper.lower()]
    first = upper.lower() if platform_first else upper  # the record keeps the first witness's spelling
    assert [r["EventId"] for r in rows] == [first]
    witnesses = svc.event(first, now=T0 + 3 * S)["witnesses"]
    assert witnesses["platform"] is not None and witnesses["vms"] == {"web_7": vm.vm_id}
    assert [m["eventId"] for m in env.messages(vm.vm_id)] == [first]


@pytest.mark.parametrize("fresh_instance", [False, True])
def test_a_late_vm_report_of_an_event_the_platform_ended_in_another_case_is_not_revived(
        env: Env, hook: Hook, fresh_instance: bool) -> None:
    """The platform's record (lower-case EventId) has ended; a VM's late document still lists the event in
    IMDS's upper case. It is the same event, late: counted as late, no second record, no approval. On the
    instance that ended it (the ended record cached) and on a fresh one (its ended row read by key, in
    the planning read)."""
    upper = str(uuid.uuid4()).upper()
    svc = env.service()
    vm = Vm("web_8")
    svc.handle_batch([body(vm.heartbeat())], now=T0)
    svc.handle_platform_batch([msg(grid(upper.lower(), ["web_8"], "Canceled"))], now=T0 + S)
    assert [r["EventId"] for r in env.rows("Events")] == [upper.lower()]
    late = env.service() if fresh_instance else svc
    result = late.handle_batch([body(vm.incarnation_env([event(upper, ["web_8"])], at=T0 + 2 * S))],
                               now=T0 + 3 * S)
    assert result.late == 1
    assert [r["EventId"] for r in env.rows("Events")] == [upper.lower()]
    assert env.messages(vm.vm_id) == []


def test_a_late_vm_report_is_recognised_by_an_instance_whose_cache_still_holds_the_event_open(
        env: Env, hook: Hook) -> None:
    """Instance A has the platform's record (lower-case) open in its cache; instance B ends it; then A gets
    a VM's late report in upper case. A's planning read catches up (the record is gone from its open ones)
    and only then looks for the other spellings' ended rows: late, no second record, no approval."""
    upper = str(uuid.uuid4()).upper()
    a_inst, b_inst = env.service(), env.service()
    vm = Vm("web_9")
    a_inst.handle_batch([body(vm.heartbeat())], now=T0)
    a_inst.handle_platform_batch([msg(grid(upper.lower(), ["web_9"], "Scheduled", grid_id="g-s"))],
                                 now=T0 + S)
    assert upper.lower() in a_inst.state.active
    b_inst.handle_platform_batch([msg(grid(upper.lower(), ["web_9"], "Canceled", grid_id="g-c"))],
                                 now=T0 + 2 * S)
    result = a_inst.handle_batch([body(vm.incarnation_env([event(upper, ["web_9"])], at=T0 + 3 * S))],
                                 now=T0 + 4 * S)
    assert result.late == 1
    assert [r["EventId"] for r in env.rows("Events")] == [upper.lower()]
    assert [m["eventId"] for m in env.messages(vm.vm_id)] in ([], [upper.lower()])  # (A's own, while open)


def test_a_late_vm_report_in_another_case_joins_an_ended_record_whose_alert_is_still_owed(
        env: Env, hook: Hook) -> None:
    """As above, but the platform's record keeps its open row after it ended: its end's alert is still owed
    (the webhook is down, the floor at info). Instance A dropped it from its open events unread; a VM's late
    upper-case report reads that row (as a report in the same case does): no second record, no approval."""
    upper = str(uuid.uuid4()).upper()
    a_inst, b_inst = env.service(), env.service(STATUS_ALERT_MIN_SEVERITY="info", ALERT_MAX_ATTEMPTS="1")
    vm = Vm("web_10")
    a_inst.handle_batch([body(vm.heartbeat())], now=T0)
    a_inst.handle_platform_batch([msg(grid(upper.lower(), ["web_10"], "Scheduled", grid_id="g-s"))],
                                 now=T0 + S)
    sent = len(env.messages(vm.vm_id))
    hook.fail_next(10)
    b_inst.handle_platform_batch([msg(grid(upper.lower(), ["web_10"], "Canceled", grid_id="g-c"))],
                                 now=T0 + 2 * S)
    hook.fail_next(0)
    (row,) = env.rows("Events")
    assert row["EventId"] == upper.lower() and row["Ended"] is True and row["PendingAlertCount"] >= 1
    a_inst.handle_batch([body(vm.incarnation_env([event(upper, ["web_10"])], at=T0 + 3 * S))],
                        now=T0 + 4 * S)
    assert [r["EventId"] for r in env.rows("Events")] == [upper.lower()]
    assert len(env.messages(vm.vm_id)) == sent  # nothing more sent for an ended event


def test_redelivery_is_a_duplicate_and_status_only_moves_forward(env: Env, hook: Hook) -> None:
    svc = env.service()
    vm = Vm("web-7")
    svc.handle_batch([body(vm.heartbeat())], now=T0)
    scheduled, started = grid("E2", ["web-7"], grid_id="g-1"), grid("E2", ["web-7"], "Started", grid_id="g-2")
    assert svc.handle_platform_batch([msg(started)], now=T0 + S).processed == 1
    late = svc.handle_platform_batch([msg(scheduled, started)], now=T0 + 2 * S)  # reordered + redelivered
    assert late.duplicates == 1 and late.stale == 1
    again = env.service().handle_platform_batch([msg(started)], now=T0 + 3 * S)  # another instance: durable
    assert again.duplicates == 1
    view = svc.event("E2", now=T0 + 3 * S)
    assert view["status"] == "Started" and [h["status"] for h in view["history"]] == ["Started"]
    assert view["witnesses"]["platform"]["gridIds"] == ["g-2", "g-1"]


def test_the_platform_s_canceled_ends_an_event_imds_still_lists(env: Env, hook: Hook) -> None:
    svc = env.service()
    vm = Vm("web-7")
    ev = event("E3", ["web-7"])
    svc.handle_batch([body(vm.heartbeat()), body(vm.incarnation_env([ev]))], now=T0)
    svc.handle_platform_batch([msg(grid("E3", ["web-7"]), grid("E3", ["web-7"], "Canceled"))], now=T0 + S)
    view = svc.event("E3", now=T0 + S)
    assert (view["status"], view["state"]) == ("Cancelled", "ended")
    assert view["history"][-1] == {"status": "Cancelled", "said": "Canceled", "witness": "platform", "vm": "",
                                   "at": view["history"][-1]["at"]}
    assert view["witnesses"]["platform"]["said"] == "Canceled"
    still = svc.handle_batch([body(vm.incarnation_env([ev], at=T0 + 2 * S))], now=T0 + 2 * S)
    assert still.late == 1 and svc.event("E3")["status"] == "Cancelled"  # never revived


def test_the_platform_s_completed_corrects_the_guess_of_an_unlisting(env: Env, hook: Hook) -> None:
    svc = env.service()
    vm = Vm("web-7")
    ev = event("E4", ["web-7"])
    svc.handle_batch([body(vm.heartbeat()), body(vm.incarnation_env([ev]))], now=T0)
    svc.handle_batch([body(vm.incarnation_env([], at=T0 + 60 * S))], now=T0 + 60 * S)  # gone between polls
    assert svc.event("E4")["status"] == "Cancelled"  # the guess: never seen Started
    svc.handle_platform_batch([msg(grid("E4", ["web-7"], "Completed"))], now=T0 + 61 * S)
    for reader in (svc, env.service()):  # the corrected row is what every instance reads
        view = reader.event("E4")
        assert view["status"] == "Completed" and view["history"][-1]["corrects"] == "Cancelled"


def test_platform_facts_outrank_a_vm_s(env: Env, hook: Hook) -> None:
    svc = env.service()
    a, b = Vm("db-1"), Vm("db-2")
    svc.handle_batch([body(a.heartbeat()), body(b.heartbeat())], now=T0)
    # db-1 reported first, with a NotBefore the platform does not say: the platform's wins, alerted
    made_up = event("E5", ["db-1"], not_before=T0 + 60 * 60 * S)
    svc.handle_batch([body(a.incarnation_env([made_up]))], now=T0)
    svc.handle_platform_batch([msg(grid("E5", ["db-1", "db-2"], kind="availabilitySets", owner="avset"))],
                              now=T0 + S)
    view = svc.event("E5", now=T0 + S)
    assert view["resources"] == ["db-1", "db-2"] and view["notBefore"].startswith("2026-11-21T12:15:00")
    contradicts = [x for x in hook.alerts() if x.get("kind") == "platform-contradicts"]
    assert len(contradicts) == 1 and "db-1" in contradicts[0]["text"]
    # afterwards a VM report that contradicts the platform is refused (quarantined, alerted)
    refused = svc.handle_batch([body(b.incarnation_env([event("E5", ["db-2"])], at=T0 + 2 * S))],
                               now=T0 + 2 * S)
    assert refused.refused == 1
    assert any(x.get("kind") == "refused-report" for x in hook.alerts())
    assert "db-2" not in svc.event("E5")["reportedBy"]


def test_bad_platform_events_are_quarantined_and_alerted_never_raised(env: Env, hook: Hook) -> None:
    svc = env.service()
    result = svc.handle_platform_batch([b"{nope", msg(grid("E6", ["x"], "Paused"))], now=T0)
    assert result.quarantined == 2 and not result.errors
    rows = env.rows("Quarantine")
    assert len(rows) == 2
    alerts = [x for x in hook.alerts() if x.get("kind") == "quarantined"]
    assert len(alerts) == 1 and "platform event" in alerts[0]["text"]  # one per window, every one kept


def test_platform_events_the_store_cannot_hold_are_quarantined_not_retried(env: Env, hook: Hook) -> None:
    """An EventId holding a character Table keys forbid, a DurationInSeconds past 64 bits, a body nested past
    json's limit: each is quarantined, and the good event beside them is applied. Before, the store refused
    the batch (or json raised), and the host, which retries a batch without end, never moved past it."""
    svc = env.service()
    hostile = grid("E#7", ["web-7"])
    huge = grid("E8", ["web-8"])
    huge["data"]["resourceInfo"]["properties"]["DurationInSeconds"] = 10 ** 30
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    result = svc.handle_platform_batch([msg(hostile, huge, grid("E9", ["web-9"], "Started")), deep], now=T0)
    assert result.quarantined == 3 and not result.errors and result.processed == 1
    assert len(env.rows("Quarantine")) == 3
    assert [r for r in env.rows("Events") if r["EventId"] == "E9"]


# ---- what each witness's word counts for (point 2) -----------------------------------------------------

BUDGET = json.dumps({"version": 1, "budgets": {"per-set": {"groupBy": "scaleSet", "maxImpacted": 2}},
                     "rules": [{"name": "reboots", "action": "approve"}]})
SCOPE = "/subscriptions/0000/resourceGroups/rg"


def made_up_then_real(env: Env, **settings: str) -> Any:
    """web_0 makes up an event naming itself and web_1 (the policy approves it at once: it impacts them);
    the platform then emits a real Reboot of web_2 and web_3, which waits: the set's budget is two VMs."""
    svc = env.service(POLICY_JSON=BUDGET, **settings)
    vms = [Vm(f"web_{i}", scale_set="web") for i in range(4)]
    svc.handle_batch([body(vm.heartbeat()) for vm in vms]
                     + [body(vms[0].incarnation_env([event("MADE-UP", ["web_0", "web_1"])]))], now=T0)
    svc.handle_platform_batch([msg(grid("REAL", ["web_2", "web_3"]))], now=T0 + S)
    assert svc.event("REAL", now=T0 + S)["state"] == "waiting-budget"
    later = T0 + 301 * S
    svc.handle_batch([body(vm.heartbeat(at=later)) for vm in vms], now=later)
    svc.reevaluate(now=later + S)
    return svc, vms[2]


def test_an_opted_in_vm_s_event_the_platform_never_emitted_counts_toward_no_budget(
    env: Env, hook: Hook
) -> None:
    svc, w2 = made_up_then_real(env, PLATFORM_CONFIRM_SCOPES=SCOPE)
    assert svc.event("REAL")["state"] == "approving" and len(env.messages(w2.vm_id)) == 1
    (alert,) = [a for a in hook.alerts() if a.get("kind") == "unconfirmed"]
    assert alert["eventId"] == "MADE-UP" and "web_0" in alert["text"]


def test_without_the_scope_the_reporter_s_own_vm_still_counts(env: Env, hook: Hook) -> None:
    svc, w2 = made_up_then_real(env)
    assert svc.event("REAL")["state"] == "waiting-budget"  # web_0 reported it: 1 + 2 > 2
    assert env.messages(w2.vm_id) == []
    assert not [a for a in hook.alerts() if a.get("kind") == "unconfirmed"]


def test_a_reporter_s_claims_about_others_count_only_within_its_hourly_allowance() -> None:
    from central.model.events import EventRecord
    from central.model.vms import VmState
    from central.policy.fleet_view import FleetView
    from central.policy.witness import WitnessRules

    vms = {n: VmState(f"id-{n}", n, last_seen=T0) for n in ("a", "b")}
    rules = WitnessRules(claims_per_hour=2)
    counted = []
    for rank in (1, 2, 3):
        rec = EventRecord(event_id=f"C{rank}", first_seen=T0)
        rec.absorb(event(f"C{rank}", ["a", "b"]), "id-a", "a", T0)
        rec.claim = {"by": "a", "rank": rank}
        view = FleetView(vms, [rec], rules=rules)
        counted.append(sorted(vm.name for vm in view.impacted_vms(rec, T0 + 10 * S)))
    assert counted == [["a", "b"], ["a", "b"], ["a"]]  # the third claim this hour: only its reporter
    rec.platform = {"status": "Scheduled"}  # the platform's word: every VM it names, reported or not
    late = T0 + 600 * S
    assert sorted(vm.name for vm in FleetView(vms, [rec], rules=rules).impacted_vms(rec, late)) == ["a", "b"]


def test_a_platform_event_the_store_refuses_even_as_quarantined_is_dropped_with_an_alert(env: Env) -> None:
    """Platform ingest's set-aside of an event the store refuses: when the store refuses its quarantine rows
    too, it is dropped once a critical alert of fixed content is committed (no exception for the host to
    retry without end: the partition would stall); the next batch is applied."""
    from tests.store_faults import refusing_store

    svc = env.service()
    switch = refusing_store(svc, "E-P1")
    refused = svc.handle_platform_batch([msg(grid("E-P1", ["uni_0"]))], now=T0)
    assert any("dropped a platform event" in e for e in refused.errors), refused.errors
    assert [r["Severity"] for r in env.rows("Alerts") if r.get("Kind") == "unstorable"] == ["critical"]
    switch["on"] = False
    assert svc.handle_platform_batch([msg(grid("E-P1", ["uni_0"]))], now=T0).processed == 1
