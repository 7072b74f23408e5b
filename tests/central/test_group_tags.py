"""Budget-group tags (central.policy.group_tags): what the head's log tags a change with, when tags compare,
the groups an instance keeps reading, and FleetView refusing to count a group whose changes were deferred.
Pure."""

from __future__ import annotations

from datetime import timedelta

import pytest

from central.model.events import EventRecord
from central.model.vms import VmState
from central.policy.budgets import Budget
from central.policy.decide import DecideConfig, decide
from central.policy.document import load
from central.policy.fleet_view import FleetView
from central.policy.group_tags import Grouping, RecentGroups, StaleGroups, tag

from .factory import T0

PER_SET, PER_ZONE = Budget("s", "scaleSet", "", 1), Budget("z", "zone", "", 3)


def test_an_events_tags_are_its_vms_groups_under_every_budget() -> None:
    grouping = Grouping.of([PER_SET, PER_ZONE])
    web = VmState("v1", "web_1", scale_set="Web", zone="2")
    solo = VmState("v2", "solo")  # in no scale set, no zone: in no group
    assert grouping.tags_of([web]) == {tag("s:web"), tag("z:2")}  # keys as the budgets make them
    assert grouping.tags_of([solo]) == frozenset()  # in no group: read by no other decision
    assert grouping.tags_of([web, None]) is None  # a VM not known: read by everyone
    assert Grouping.of([Budget("f", "fleet", "", 5)]).tags_of([solo]) == {tag("f:fleet")}
    assert Grouping.of([Budget("f", "fleet", "", 5)]).tags_of([None]) == {tag("f:fleet")}  # whoever it is
    assert Grouping.of([]).tags_of([None]) == frozenset()  # no budgets: no decision reads another event
    assert len(tag("s:web")) == 8 and tag("s:web") != tag("s:db")


def test_tags_compare_only_under_the_same_groupings() -> None:
    fingerprint = Grouping.of([PER_SET, PER_ZONE]).fingerprint
    assert Grouping.of([PER_ZONE, PER_SET]).fingerprint == fingerprint  # the order of budgets: no matter
    assert Grouping.of([Budget("s", "scaleSet", "", 9), PER_ZONE]).fingerprint == fingerprint  # limits: none
    assert Grouping.of([PER_SET]).fingerprint != fingerprint  # another grouping: readers read everything
    assert Grouping.of([Budget("s", "zone", "", 1), PER_ZONE]).fingerprint != fingerprint


def test_an_instance_keeps_reading_the_groups_it_decided_in_lately() -> None:
    recent = RecentGroups()
    assert recent.widen(frozenset({"a"}), T0) == {"a"}
    assert recent.widen(frozenset({"b"}), T0 + timedelta(minutes=4)) == {"a", "b"}
    assert recent.widen(frozenset(), T0 + timedelta(minutes=6)) == {"b"}  # a: not decided in for 5 minutes
    assert recent.widen(None, T0 + timedelta(minutes=6)) is None  # every group: as asked


def test_counting_a_group_whose_changes_were_deferred_raises_stale_groups() -> None:
    """FleetView (central.policy.fleet_view) refuses to count a budget group some of whose changed events the
    cache has not read: a decision there waits for them (the caller reads them and decides again); a
    decision in another group goes on."""
    policy = load('{"version": 1, "budgets": {"s": {"groupBy": "scaleSet", "maxImpacted": 1}}, "rules": '
                  '[{"name": "r", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}]}')
    vms = {n: VmState(f"id-{n}", n, scale_set=s, last_seen=T0) for n, s in (("web_0", "web"), ("db_0", "db"))}

    def hint(event: EventRecord, budget: Budget) -> frozenset:
        return frozenset(g for n in event.resources for g in (budget.group_of(vms[n]),) if g)

    def view(stale: frozenset, placed: bool = True) -> FleetView:
        return FleetView(vms, [], stale=stale, groups_hint=hint if placed else None)

    def reboot(name: str) -> EventRecord:
        return EventRecord(event_id=f"E-{name}", first_seen=T0, resources=[name], event_type="Reboot",
                           status="Scheduled", not_before=T0 + timedelta(minutes=15),
                           reported_by={name: f"id-{name}"})

    with pytest.raises(StaleGroups) as stale:
        decide(reboot("db_0"), view(frozenset({tag("s:db")})), policy, T0, DecideConfig())
    assert stale.value.tags == {tag("s:db")}
    assert decide(reboot("web_0"), view(frozenset({tag("s:db")})), policy, T0, DecideConfig()).kind == "send"
    assert decide(reboot("db_0"), view(frozenset()), policy, T0, DecideConfig()).kind == "send"
    with pytest.raises(StaleGroups):  # a view that cannot place events counts every one: any stale group
        decide(reboot("web_0"), view(frozenset({tag("s:db")}), placed=False), policy, T0, DecideConfig())


def test_a_change_is_tagged_only_by_the_vm_rows_its_names_still_resolve_to() -> None:
    """A reader counts an event's VMs by name; the writer tags it by the rows those names resolve to: the
    change's own bound rows, else cached rows bound and heard from within NAME_RELEASE (a name moves to
    another vmId only after that long a silence). Otherwise untagged: every reader reads the change."""
    from central.store.fleet_state import FleetState

    state = FleetState(None)  # type: ignore[arg-type]  # the cache alone: no store call is made
    state.grouping, state.name_release = Grouping.of([PER_ZONE]), timedelta(hours=1)
    state.cache_vm("A", VmState("A", "web1", zone="1", last_seen=T0), "etag")
    rec = EventRecord(event_id="E", first_seen=T0, resources=["web1"])
    assert state.event_tags(rec, {}, T0 + timedelta(minutes=10)) == {tag("z:1")}
    assert state.event_tags(rec, {}, T0 + timedelta(hours=2)) is None  # silent an hour: the name may move
    moved = VmState("B", "web1", zone="2", last_seen=T0 + timedelta(hours=2))
    assert state.event_tags(rec, {"web1": moved}, T0 + timedelta(hours=2)) == {tag("z:2")}  # the change's
    state.name_release = None  # (a FleetState the service did not set up: no cached name is trusted)
    assert state.event_tags(rec, {}, T0 + timedelta(minutes=10)) is None
