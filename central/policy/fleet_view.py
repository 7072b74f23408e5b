"""What deciding about one event may look at (pure): the VMs central knows and every open event, and the
disruption budgets' counts over them, built per group as decisions ask (central.policy.decide)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from central.model.events import EventRecord
from central.model.vms import VmState

from .budgets import KNOWN_WITHIN, Budget, group_members
from .group_tags import StaleGroups, tag
from .witness import WitnessRules, counted

IMPACTING_STATES = ("approving", "approved", "expired")  # expired: NotBefore passed, starts any moment
WAITING_BUDGET = "waiting-budget"  # the state of an event a disruption budget holds back

# A budget's groups of an event's VMs, when they are known without reading its VMs (None: not known):
# central.runtime.evaluator gives them from cached rows that a fresh read would not change.
GroupsHint = Callable[[EventRecord, Budget], Optional[FrozenSet[str]]]
GroupIndex = Tuple[Dict[str, List[EventRecord]], List[EventRecord]]  # group -> its events; events of no hint


@dataclass
class FleetView:
    """What deciding about one event may look at: the VMs central knows (by name, the way IMDS's
    Resources name them) and every open event (for disruption budgets). A group's budget count is built
    the first time a decision asks for it (from the impacting events that may have VMs in it: all of
    them, unless `groups_hint` says which) and kept current by `mark_impacting` as a pass decides."""

    vms_by_name: Mapping[str, VmState]
    open_events: Sequence[EventRecord]
    liveness: timedelta = timedelta(seconds=300)  # DecideConfig.liveness
    # every VM central knows, read when a percentage budget needs group sizes (None: those in vms_by_name)
    known: Optional[Callable[[], Sequence[VmState]]] = None
    rules: WitnessRules = field(default_factory=WitnessRules)  # DecideConfig.witness
    groups_hint: Optional[GroupsHint] = None
    # the group tags whose changed events the cache has not read (central.policy.group_tags): a count of
    # one of those groups raises StaleGroups instead of counting stale copies
    stale: FrozenSet[str] = frozenset()
    _sizes: Dict[str, Dict[str, int]] = field(default_factory=dict)
    _members: Dict[Tuple[Budget, str], Dict[str, Set[str]]] = field(default_factory=dict)  # -> vm -> events
    _marked: List[EventRecord] = field(default_factory=list)  # made impacting by this pass
    _by_group: Dict[Budget, GroupIndex] = field(default_factory=dict)
    _impacting: Dict[datetime, List[EventRecord]] = field(default_factory=dict)

    def impacting_events(self, now: datetime) -> List[EventRecord]:
        """The open events that count against budgets at `now`, found once per view (a pass asks for
        every budget, and the VMs to read: thousands of events in a 100k wave)."""
        found = self._impacting.get(now)
        if found is None:
            found = self._impacting[now] = [other for other in self.open_events if impacting(other, now)]
        return found

    def impacting_in(self, budget: Budget, groups: Iterable[str], now: datetime) -> List[EventRecord]:
        """The impacting events that may have VMs in `groups` of `budget`: those the hint puts there and
        those it knows nothing of (every impacting event without a hint). Indexed once per budget."""
        groups = list(groups)
        self._fresh(groups)
        if self.groups_hint is None:
            return self.impacting_events(now)
        index = self._by_group.get(budget)
        if index is None:
            by_group: Dict[str, List[EventRecord]] = {}
            unknown: List[EventRecord] = []
            for other in self.impacting_events(now):
                hint = self.groups_hint(other, budget)
                if hint is None:
                    unknown.append(other)
                for group in hint or ():
                    by_group.setdefault(group, []).append(other)
            index = self._by_group[budget] = (by_group, unknown)
        by_group, unknown = index
        found = {id(rec): rec for group in groups for rec in by_group.get(group, ())}
        return unknown + [rec for rec in found.values()]

    def _fresh(self, groups: Sequence[str]) -> None:
        if self.stale:
            found = frozenset(self.stale) if self.groups_hint is None else frozenset(
                t for t in map(tag, groups) if t in self.stale)
            if found:
                raise StaleGroups(found)

    def vms_of(self, event: EventRecord) -> List[VmState]:
        vms = self.vms_by_name  # one lookup per name (a budget count asks for every impacting event's VMs)
        return [vm for vm in map(vms.get, event.resources) if vm is not None]

    def _group_members(self, budget: Budget, group: str, now: datetime) -> Dict[str, Set[str]]:
        found = self._members.get((budget, group))
        if found is None:
            self._fresh([group])
            found = self._members[(budget, group)] = {}
            for other in [*self.impacting_in(budget, [group], now), *self._marked]:
                self._add(found, budget, group, other, now)
        return found

    def impacted_vms(self, event: EventRecord, now: datetime) -> List[VmState]:
        """The VMs of `event` that count against budgets now (central.policy.witness)."""
        return counted(event, self.vms_of(event), self.rules, now, self.liveness)

    def _add(self, members: Dict[str, Set[str]], budget: Budget, group: str, event: EventRecord,
             now: datetime) -> None:
        for vm in self.impacted_vms(event, now):
            if budget.group_of(vm) == group:
                _count(members, vm, event)

    def mark_impacting(self, event: EventRecord, now: datetime) -> None:
        """An event this pass just approved now counts against every budget group, counted or not yet."""
        self._marked.append(event)
        vms = self.impacted_vms(event, now)
        for budget in {budget for budget, _ in self._members}:  # (each VM to its own group's count, if built)
            for vm in vms:
                members = self._members.get((budget, budget.group_of(vm) or ""))
                if members is not None:
                    _count(members, vm, event)

    def group_size(self, budget: Budget, group: str, now: datetime) -> int:
        """VMs of `group` heard from within budgets.KNOWN_WITHIN (a percentage budget's base)."""
        sizes = self._sizes.get(budget.name)
        if sizes is None:
            vms = self.known() if self.known is not None else list(self.vms_by_name.values())
            recent = [vm for vm in vms if vm.live(now, KNOWN_WITHIN)]
            sizes = {g: len(m) for g, m in group_members(budget, recent).items()}
            self._sizes[budget.name] = sizes
        return sizes.get(group, 0)

    def busy(self, budget: Budget, group: str, event_id: str, now: datetime) -> Set[str]:
        """VM ids of `group` impacted by events other than `event_id`."""
        members = self._group_members(budget, group, now)
        return {vm for vm, events in members.items() if events - {event_id}}


def _count(members: Dict[str, Set[str]], vm: VmState, event: EventRecord) -> None:
    members.setdefault(vm.vm_id, set()).add(event.event_id)  # (a group's count: vmId -> its events)


def seen_by_others(event: EventRecord) -> Tuple[Any, ...]:
    """What deciding about another event reads of this one, at any time: whether it impacts
    (`impacting`), which of its VMs count (central.policy.witness.counted: its reporters, listers, claim,
    platform witness, first sight), and whether and since when it waits for a budget slot
    (central.runtime.inline). A change that leaves this the same cannot change another event's decision
    (central.runtime.ingest commits it without moving the State head)."""
    if event.ended:
        return ("ended",)
    always = event.status == "Started" or event.state in IMPACTING_STATES
    out = event.outstanding
    return (always, None if always or out is None else out.expires_at, None if always else event.not_before,
            event.state == WAITING_BUDGET, event.first_seen, tuple(event.resources),
            tuple(sorted(event.reported_by.items())), tuple(event.listed_by), bool(event.platform),
            event.claim.get("rank") if event.claim else None)


def impacting(event: EventRecord, now: datetime) -> bool:
    """Counts against disruption budgets: Started, an approval outstanding (even if held since) or
    confirmed, or NotBefore passed (Azure starts it any moment), and not ended."""
    if event.ended:
        return False
    if event.status == "Started" or event.state in IMPACTING_STATES:
        return True
    out = event.outstanding  # an approval already sent counts whatever came after (a hold cannot recall it)
    if out is not None and now < out.expires_at:
        return True
    return event.not_before is not None and now >= event.not_before
