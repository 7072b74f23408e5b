"""Budget counts per group (central.policy.fleet_view) and the VM rows a pass reads for them
(central.runtime.vm_facts): a count built from the groups the cache vouches for is the count over every
impacting event, and reads and counts only the events that may share a group with what is decided. Pure."""

from __future__ import annotations

import copy
import random
from datetime import timedelta
from typing import Dict, Iterator, List, Mapping

from central.model.events import Approval, EventRecord
from central.model.vms import VmState
from central.policy.budgets import Budget
from central.policy.fleet_view import FleetView, impacting, seen_by_others
from central.policy.witness import WitnessRules, counted
from central.runtime.inline import waits
from central.runtime.vm_facts import LazyVms, groups_hint

from .factory import T0, event

LIVENESS = timedelta(seconds=300)
PER_SET, PER_ZONE = Budget("s", "scaleSet", "", 2), Budget("z", "zone", "", 3)


class Counting(Mapping):
    """A VMs-by-name mapping that counts the names looked up."""

    def __init__(self, vms: Dict[str, VmState]) -> None:
        self.vms, self.asked = vms, 0

    def __getitem__(self, name: str) -> VmState:
        self.asked += 1
        return self.vms[name]

    def get(self, name: str, default: object = None) -> object:  # type: ignore[override]
        self.asked += 1
        return self.vms.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.vms)

    def __len__(self) -> int:
        return len(self.vms)


def approved(event_id: str, names: List[str], vms: Dict[str, VmState]) -> EventRecord:
    rec = EventRecord(event_id=event_id, first_seen=T0 - timedelta(minutes=10))
    for name in names:
        rec.absorb(event(event_id, names), vms[name].vm_id, name, T0 - timedelta(minutes=10))
    rec.state = "approved"  # (counts against budgets until it ends)
    return rec


def fleet(seed: int) -> tuple:
    rng = random.Random(seed)  # noqa: S311 (a test fleet)
    silent = set(rng.sample(range(60), 6))  # heard from 15 minutes ago: their cached rows vouch for nothing
    vms = {f"vm{i}": VmState(f"id-{i}", f"vm{i}", scale_set=f"ss{i % 6}", zone=str(i % 2 + 1),
                             last_seen=T0 - timedelta(seconds=900 if i in silent else 10))
           for i in range(60)}
    names = list(vms)
    events = [approved(f"E{j}", rng.sample(names, rng.choice([1, 1, 2])), vms) for j in range(40)]
    return vms, events


def test_a_count_from_the_groups_the_cache_vouches_for_is_the_count_over_every_impacting_event() -> None:
    for seed in range(5):
        vms, events = fleet(seed)
        full = FleetView(Counting(vms), events, LIVENESS)
        hinted_vms = Counting(vms)
        hinted = FleetView(hinted_vms, events, LIVENESS, groups_hint=groups_hint(vms, {}, T0, LIVENESS))
        for budget in (PER_SET, PER_ZONE):
            groups = {budget.group_of(vm) for vm in vms.values()}
            for group in sorted(g for g in groups if g):
                assert hinted.busy(budget, group, "E0", T0) == full.busy(budget, group, "E0", T0), seed
        # one group's count looks at that group's events and those with a silent VM (no hint), not all 40
        full_vms, hinted_vms = Counting(vms), Counting(vms)
        FleetView(full_vms, events, LIVENESS).busy(PER_SET, "s:ss0", "E0", T0)
        FleetView(hinted_vms, events, LIVENESS, groups_hint=groups_hint(vms, {}, T0, LIVENESS)).busy(
            PER_SET, "s:ss0", "E0", T0)
        assert full_vms.asked == sum(len(e.resources) for e in events)
        looked_at = [e for e in events if any(vms[n].scale_set == "ss0" or vms[n].last_seen < T0 - LIVENESS
                                              for n in e.resources)]
        assert hinted_vms.asked == sum(len(e.resources) for e in looked_at) < full_vms.asked * 0.7, seed


def test_an_event_with_a_vm_the_cache_cannot_vouch_for_is_looked_at_for_every_group() -> None:
    vms = {"a": VmState("id-a", "a", scale_set="web", last_seen=T0),  # b is silent: its name may have moved
           "b": VmState("id-b", "b", scale_set="db", last_seen=T0 - timedelta(hours=2))}
    quiet = approved("E-b", ["b"], vms)
    view = FleetView(vms, [approved("E-a", ["a"], vms), quiet], LIVENESS,
                     groups_hint=groups_hint(vms, {}, T0, LIVENESS))
    assert [e.event_id for e in view.impacting_in(PER_SET, ["s:web"], T0)] == ["E-b", "E-a"]
    assert [e.event_id for e in view.impacting_in(PER_SET, ["s:other"], T0)] == ["E-b"]
    # a plan's row stands over the cache's: its groups are known
    planned = {"id-b": VmState("id-b", "b", scale_set="db", last_seen=T0)}
    view = FleetView(vms, [quiet], LIVENESS, groups_hint=groups_hint(vms, planned, T0, LIVENESS))
    assert view.impacting_in(PER_SET, ["s:web"], T0) == []


def test_an_event_approved_earlier_in_the_pass_counts_in_groups_counted_later() -> None:
    vms = {"a": VmState("id-a", "a", scale_set="web", zone="1", last_seen=T0),
           "b": VmState("id-b", "b", scale_set="web", zone="1", last_seen=T0)}
    view = FleetView(vms, [], LIVENESS, groups_hint=groups_hint(vms, {}, T0, LIVENESS))
    assert view.busy(PER_SET, "s:web", "X", T0) == set()
    view.mark_impacting(approved("E-a", ["a"], vms), T0)
    assert view.busy(PER_SET, "s:web", "X", T0) == {"id-a"}  # counted before: kept current
    assert view.busy(PER_ZONE, "z:1", "X", T0) == {"id-a"}  # first counted after the approval


def test_the_vms_of_a_pass_are_read_in_two_steps_and_a_name_outside_both_when_asked() -> None:
    stored = {n: VmState(f"id-{n}", n) for n in ("a", "b", "c", "d")}
    reads: List[set] = []

    def read(names: object) -> Dict[str, VmState]:
        wanted = set(names)  # type: ignore[call-overload]
        reads.append(wanted)
        return {n: stored[n] for n in wanted if n in stored}

    lazy = LazyVms({"a"}, lambda found: {"a", "b"} if "a" in found else set(), read)
    assert reads == []  # nothing read until a decision looks
    assert sorted(lazy) == ["a", "b"] and reads == [{"a"}, {"b"}]
    assert lazy.get("c") is stored["c"] and "c" in lazy and reads[-1] == {"c"}
    assert lazy.get("zz") is None and "zz" not in lazy and reads[-1] == {"zz"} and len(reads) == 4


def _mutations(rec: EventRecord, rng: random.Random) -> None:
    """One random change of the kinds an event's life brings (reports, decisions, results, the platform)."""
    at = T0 + timedelta(seconds=rng.choice([-900, -60, 0, 60, 900]))
    kind = rng.randrange(14)
    if kind == 0:
        rec.status = rng.choice(["Scheduled", "Started", "Completed", "Cancelled"])
    elif kind == 1:
        rec.state = rng.choice(["new", "approving", "approved", "held", "waiting-budget", "no-leader",
                                "expired", "starts-at-notbefore", "approval-failed"])
    elif kind == 2:
        rec.approvals.append(Approval(len(rec.approvals) + 1, "m", "id-1", "vm1", "q", "approve", "rule", at,
                                      at + timedelta(minutes=rng.choice([1, 10]))))
    elif kind == 3 and rec.approvals:
        rec.approvals[-1].result = rng.choice(["Started", "timeout", None])
    elif kind == 4:
        rec.not_before = at
    elif kind == 5:
        rec.first_seen = at
    elif kind == 6:
        rec.resources = sorted({*rec.resources, rng.choice(["vm1", "vm2", "vm3"])})
    elif kind == 7:
        rec.reported_by[rng.choice(["vm1", "vm2"])] = rng.choice(["id-1", "id-2", "id-9"])
    elif kind == 8:
        rec.listed_by = rng.sample(["id-1", "id-2", "id-3"], rng.randrange(3))
    elif kind == 9:
        rec.platform = rng.choice([{}, {"status": "Scheduled"}, {"status": "Started", "lastHeard": "x"}])
    elif kind == 10:
        rec.claim = rng.choice([{}, {"rank": 1}, {"rank": 9}])
    else:  # what no other decision reads: must never matter
        rec.description, rec.outcome, rec.ever_started = f"d{rng.random()}", "Started", rng.random() < 0.5
        rec.history.append({"status": rec.status, "at": at.isoformat()})
        rec.pending_alerts = [{"key": f"k{rng.random()}"}] if rng.random() < 0.5 else []
        rec.decision = {"action": rng.choice(["approve", "wait"]), "reason": "r"}


def test_a_change_that_keeps_seen_by_others_changes_no_other_decision() -> None:
    """fleet_view.seen_by_others (issue 24 item 4: ingest leaves such changes out of the head's log): two
    records it does not tell apart count alike against every budget (impacting, which VMs count, with the
    platform's confirmation asked for or not) and wait alike for a slot (waits, first sight, VMs), at any
    time."""
    rng = random.Random(7)  # noqa: S311 (reproducible records)
    vms = [VmState(f"id-{i}", f"vm{i}", scale_set="ss",
                   last_seen=T0 - timedelta(seconds=rng.choice([10, 900])),
                   resource_id=f"/subscriptions/s/resourcegroups/rg/providers/x/vm{i}") for i in (1, 2, 3)]
    rules = [WitnessRules(), WitnessRules(confirm_scopes=("/subscriptions/s/resourcegroups/rg",))]
    alike = differ = 0
    for _ in range(3000):
        one = EventRecord(event_id="E1", first_seen=T0 - timedelta(minutes=5), resources=["vm1"],
                          reported_by={"vm1": "id-1"}, listed_by=["id-1"])
        for _ in range(rng.randrange(4)):
            _mutations(one, rng)
        two = copy.deepcopy(one)
        for _ in range(rng.randrange(1, 3)):
            _mutations(two, rng)
        if seen_by_others(one) != seen_by_others(two):
            differ += 1
            continue
        alike += 1
        if one.ended:  # never counted nor waiting again: nothing else of it is read
            assert two.ended and not impacting(two, T0) and not waits(two)
            continue
        for now in (T0 - timedelta(minutes=20), T0, T0 + timedelta(seconds=59), T0 + timedelta(minutes=30)):
            assert impacting(one, now) == impacting(two, now)
            for rule in rules:
                assert ([vm.vm_id for vm in counted(one, vms, rule, now, LIVENESS)]
                        == [vm.vm_id for vm in counted(two, vms, rule, now, LIVENESS)])
        assert waits(one) == waits(two) and one.first_seen == two.first_seen
        assert (one.resources, one.reported_by) == (two.resources, two.reported_by)
    assert alike > 300 and differ > 300  # both kinds of pairs were tried
