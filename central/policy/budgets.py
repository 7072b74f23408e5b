"""Disruption budget arithmetic, pure: a budget's limit for a group, group sizes, and whether one
more event would push a group over its limit.

A budget groups the VMs central knows (those with a forwarder) by scale set, placement group, zone,
a tag, or the whole fleet (`groupBy: "fleet"`, one group). Its limit is `maxImpacted` VMs, or
`maxImpactedPercent` of the group's known VMs rounded down, never below 1 (a budget of 10 % on a
5-VM group still lets one VM go early; with 0 every event of the group would wait for NotBefore).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import AbstractSet, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

from central.model.vms import VmState

# A percentage budget's base: the group's VMs heard from within this (a VM deleted long ago, or whose
# forwarder was removed, no longer makes the group look bigger than it is).
KNOWN_WITHIN = timedelta(hours=24)
_GROUP_FIELDS = {"scaleSet": "scale_set", "placementGroup": "placement_group", "zone": "zone"}  # VmState's


@dataclass(frozen=True)
class Budget:
    name: str
    group_by: str  # scaleSet | placementGroup | zone | tag | fleet
    tag: str
    # The count for maxImpacted budgets. A percentage budget keeps 1 here (the safe floor) for code
    # that reads it directly; budget_limit() / limit() give its real limit for a group's size.
    max_impacted: int
    percent: Optional[int] = None  # maxImpactedPercent: a share of the group's VMs
    # a VM's value -> its group key, made once per value (group_of runs for every impacting event's VMs on
    # each pass: thousands in a 100k wave); not part of the budget's identity
    _keys: Dict[str, str] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def group_of(self, vm: VmState) -> Optional[str]:
        """The group key this VM counts in, or None when the VM is in no group of this kind."""
        if self.group_by == "tag":
            value = vm.budget_tags.get(self.tag, "")  # bound at first sight: a claim cannot move it
        elif self.group_by == "fleet":
            value = "fleet"
        else:  # (called for every impacting event's VMs on each pass: no mapping built per call)
            value = getattr(vm, _GROUP_FIELDS[self.group_by])
        if not value:
            return None
        key = self._keys.get(value)
        if key is None:
            key = self._keys[value] = f"{self.name}:{value.lower()}"
        return key

    def limit(self, group_size: int) -> int:
        """How many VMs of a group of `group_size` known VMs may be impacted at once."""
        return budget_limit(self, group_size)


def budget_limit(budget: Budget, group_size: int) -> int:
    """How many VMs of a group with `group_size` known VMs may be impacted at once."""
    if budget.percent is None:
        return budget.max_impacted
    return max(1, group_size * budget.percent // 100)


def group_members(budget: Budget, vms: Iterable[VmState]) -> Dict[str, Set[str]]:
    """Group key -> vmIds of `vms` in it (VMs in no group of this kind are left out)."""
    out: Dict[str, Set[str]] = {}
    for vm in vms:
        group = budget.group_of(vm)
        if group:
            out.setdefault(group, set()).add(vm.vm_id)
    return out


@dataclass(frozen=True)
class FleetState:
    """What a budget needs besides the event: every VM central knows (group sizes) and the VMs
    already impacted by other events (Started, or approval outstanding/confirmed, not ended)."""

    known_vms: Sequence[VmState]
    impacted_vms: Sequence[VmState]


@dataclass(frozen=True)
class BudgetBlock:
    """One budget group the event would push over its limit."""

    budget: str
    group: str
    busy: int  # VMs of the group impacted by other events
    mine: int  # VMs of the group in this event
    limit: int
    group_size: int

    def reason(self) -> str:
        if not self.busy:
            return (
                f"budget {self.budget}: this event alone affects {self.mine} VMs of {self.group}, "
                f"more than {self.limit}; held until NotBefore or an operator approves"
            )
        return (
            f"budget {self.budget}: {self.busy} VM(s) of {self.group} already impacted, "
            f"{self.mine} more would pass {self.limit}"
        )

    def to_json(self) -> Dict[str, object]:
        return {"budget": self.budget, "group": self.group, "busy": self.busy, "mine": self.mine,
                "limit": self.limit, "groupSize": self.group_size, "reason": self.reason()}


def budget_block(
    budgets: Sequence[Budget], event_vms: Sequence[VmState], fleet: FleetState
) -> Optional[BudgetBlock]:
    """The first budget group (budgets in order, groups sorted) this event would push over its
    limit; None when it may go. A group's size counts the known VMs and this event's own VMs."""
    for budget in budgets:
        everyone = group_members(budget, [*fleet.known_vms, *event_vms])
        impacted = group_members(budget, fleet.impacted_vms)
        for group, members in sorted(group_members(budget, event_vms).items()):
            busy = impacted.get(group, set()) - members
            limit = budget_limit(budget, len(everyone.get(group, members)))
            if len(busy) + len(members) > limit:
                return BudgetBlock(budget.name, group, len(busy), len(members), limit, len(everyone[group]))
    return None


def groups_of(budgets: Sequence[Budget], vms: Iterable[VmState]) -> FrozenSet[str]:
    """Every group of any of `budgets` that one of `vms` counts in."""
    return frozenset(g for vm in vms for b in budgets for g in (b.group_of(vm),) if g)


def next_waiters(freed: Sequence[AbstractSet[str]],
                 waiting: Sequence[Tuple[str, AbstractSet[str]]]) -> List[str]:
    """For each freed VM (the groups it counted in), the first of the `waiting` events (id, its groups; in
    the order given) in one of those groups and not taken for an earlier freed VM: the events the freed
    slots may let go, one per slot (slots freed in two groups go to a waiter of each, not to the two oldest
    waiters of one group)."""
    taken: List[str] = []
    seen: Set[str] = set()  # (an event naming 1,000 VMs frees 1,000 at once)
    for groups in freed:
        for event_id, theirs in waiting:
            if event_id not in seen and not theirs.isdisjoint(groups):
                taken.append(event_id)
                seen.add(event_id)
                break
    return taken


def limits_for(budgets: Sequence[Budget], event_vms: Sequence[VmState],
               known_vms: Sequence[VmState]) -> List[Dict[str, object]]:
    """Each budget group of this event with its size and limit (for explanations)."""
    out: List[Dict[str, object]] = []
    for budget in budgets:
        everyone = group_members(budget, [*known_vms, *event_vms])
        for group in sorted(group_members(budget, event_vms)):
            size = len(everyone[group])
            out.append({"budget": budget.name, "group": group, "groupSize": size,
                        "limit": budget_limit(budget, size)})
    return out
