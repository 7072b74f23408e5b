"""Issue 23, point 4: Resource Graph rows -> what-if history (central.cli.graph_rows, pure), on rows shaped as
Microsoft's docs show them (scheduled-events-resource-graph.md's columns; the Event Grid sample's properties;
a Completed Freeze with NotBefore "" as captured payloads have it), then replayed with the same `decide`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List

from central.cli import graph_rows, whatif
from central.policy import document as policy_mod

SUB = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
NOW = datetime(2025, 9, 19, 18, 0, tzinfo=timezone.utc)


def row(event_id: str, status: str, not_before: str, resources: List[str],
        owner: str = "virtualMachines/web_0", event_type: str = "Freeze", zones: Any = None,
        **extra: Any) -> Dict[str, Any]:
    rid = (f"/subscriptions/{SUB}/resourcegroups/rg-web/providers/Microsoft.Compute/{owner}"
           f"/providers/Microsoft.Maintenance/Scheduledevents/{event_id}")
    props = {"DurationInSeconds": 5,
             "Description": "Virtual machine is being paused because of a memory-preserving Live Migration "
             "operation.", "EventId": event_id, "EventSource": "Platform", "EventStatus": status,
             "EventType": event_type, "NotBefore": not_before, "Resources": resources,
             "ResourceType": "VirtualMachine", "ScheduledEventApiVersion": "2020-07-01", **extra}
    return {"id": rid, "name": event_id, "type": "microsoft.maintenance/scheduledevents",
            "tenantId": "72f988bf-0000-0000-0000-000000000000", "location": "eastus",
            "resourceGroup": "rg-web",
            "subscriptionId": SUB, "properties": props, "zones": zones if zones is not None else []}


def test_a_row_with_notbefore_is_timed_and_first_seen_at_the_minimum_notice_before_it() -> None:
    got = graph_rows.from_rows([row("3da1b9aa", "Scheduled", "Fri, 19 Sep 2025 18:29:47 GMT",
                                    ["myvmss_1", "myvmss_2"], owner="virtualMachineScaleSets/myvmss",
                                    zones=["2"])],
                               NOW - timedelta(days=30), NOW)
    (past,) = got.timed
    rec = past.record
    assert rec.not_before == datetime(2025, 9, 19, 18, 29, 47, tzinfo=timezone.utc)
    assert rec.first_seen == rec.not_before - timedelta(minutes=15)  # Freeze: 15 min notice
    assert (rec.event_type, rec.resources, rec.status) == ("Freeze", ["myvmss_1", "myvmss_2"], "Scheduled")
    assert past.approved_at is None  # Resource Graph records no approval
    assert rec.platform["owner"] == {"subscription": SUB, "resourceGroup": "rg-web",
                                     "kind": "virtualMachineScaleSets", "name": "myvmss"}
    assert got.vms["myvmss_1"].scale_set == "myvmss" and got.vms["myvmss_1"].zone == "2"
    assert got.timeless == [] and got.statuses == {"Scheduled": 1}


def test_rows_updated_in_place_to_completed_or_canceled_keep_no_time_and_are_timeless() -> None:
    rows = [row("743c15d8", "Completed", "", ["my_vm_001"]),
            row("c0ffee00", "Canceled", "", ["my_vm_002"], event_type="Reboot")]
    got = graph_rows.from_rows(rows, NOW - timedelta(days=30), NOW)
    assert got.timed == [] and [p.record.event_id for p in got.timeless] == ["743c15d8", "c0ffee00"]
    assert got.statuses == {"Completed": 1, "Cancelled": 1}  # one spelling stored; the platform's kept
    cancelled = got.timeless[1].record
    assert cancelled.platform["said"] == "Canceled" and cancelled.platform["status"] == "Cancelled"
    assert cancelled.first_seen == NOW and cancelled.not_before == NOW + timedelta(minutes=15)
    assert cancelled.status == "Scheduled"  # replayed from the start: the policy decides it
    assert got.vms["my_vm_001"].scale_set == ""  # a standalone VM owns its event


def test_since_bounds_timed_rows_only_and_bad_rows_are_named_not_raised() -> None:
    old = row("old", "Scheduled", "Mon, 01 Jan 2024 00:00:00 GMT", ["a"])
    rows: List[Any] = [old, row("new", "Scheduled", "Fri, 19 Sep 2025 18:29:47 GMT", ["b"]),
                       row("done", "Completed", "", ["c"]), "not a row", {"type": "microsoft.compute/vms"},
                       row("nores", "Scheduled", "", []), row("odd", "Paused", "", ["d"]),
                       row("badtime", "Scheduled", "tomorrow-ish", ["e"]),
                       row("new", "Scheduled", "Fri, 19 Sep 2025 18:29:47 GMT", ["b"])]  # a repeat
    got = graph_rows.from_rows(rows, NOW - timedelta(days=30), NOW)
    assert [p.record.event_id for p in got.timed] == ["new"]
    assert [p.record.event_id for p in got.timeless] == ["done"]
    assert got.before_since == 1
    assert got.skipped == ["row 4: not an object",
                           "row 5: type 'microsoft.compute/vms' is not a scheduled event",
                           "row 6: nores: no Resources", "row 7: odd: unknown EventStatus 'Paused'",
                           "row 8: badtime: NotBefore 'tomorrow-ish' is not a time"]


def test_replayed_with_the_same_decide_budgets_hold_the_second_of_one_scale_set() -> None:
    policy = policy_mod.load('{"version": 1, '
                             '"budgets": {"one-per-set": {"groupBy": "scaleSet", "maxImpacted": 1}},'
                             ' "rules": [{"name": "all", "action": "approve"}]}')
    web = "virtualMachineScaleSets/web"
    rows = [row("E1", "Scheduled", "Fri, 19 Sep 2025 18:29:47 GMT", ["web_1"], owner=web),
            row("E2", "Scheduled", "Fri, 19 Sep 2025 18:30:47 GMT", ["web_2"], owner=web)]
    got = graph_rows.from_rows(rows, NOW - timedelta(days=30), NOW)
    results = {r.event_id: r for r in whatif.replay(got.timed, got.vms, policy)}
    assert results["E1"].whatif_at == results["E1"].first_seen  # approved at first sight
    assert "waiting-budget" in results["E2"].waits  # web_1 is impacted: one per scale set
    assert results["E2"].whatif_at is not None and results["E2"].whatif_at > results["E2"].first_seen
