"""Deciding inside the ingest commit (issue 24): the events an ingest plan touched are decided on the plan's
own working copies, and the decisions go into the same transaction as the changes that caused them. A
batch that brings new events then moves the fleet's head row once instead of twice, so concurrent instances
lose fewer races on it. Correctness is the evaluator's: the transaction carries the head's If-Match, so a
decision commits only if it was taken on the current state of every event; a lost race plans and decides
again on the re-read rows.

What the decision sees of the plan: its events stand over the committed ones (budgets count them), and its
VM rows stand over the ones read from the store (a VM first heard from in this plan is not in the store
yet). A plan that frees a budget slot (an event that counted against budgets ends, or its approval is
refused or runs out) also decides, in the same transaction, the events waiting for a budget that share a
group with it, first seen first, one per VM freed: the slot goes to the next waiting event at once instead
of at the timer's next pass (which still decides every event, and stays the complete answer).

Reading VMs for the decision must not move this instance's cached ETags of the VMs the plan writes:
the plan was made on those rows, and an ETag read later would let the commit overwrite a change it never saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

from central.model.events import EventRecord, in_order_of_first_sight
from central.model.vms import VmState
from central.policy.budgets import Budget, groups_of, next_waiters
from central.policy.fleet_view import WAITING_BUDGET, impacting
from central.store.active_events import ActiveEvents
from central.store.fleet_state import Changes, FleetState


def candidates(changes: Changes, touched: Set[str]) -> List[EventRecord]:
    """The planned events to decide: touched by the plan, not ended; in order of first sight."""
    found = [rec for event_id, rec in changes.events.items() if event_id in touched and not rec.ended]
    return in_order_of_first_sight(found)


Rows = Callable[[EventRecord], List[VmState]]  # an event's VM rows as a plan sees them (found ones only)


@dataclass
class WaitingGroups:
    """The events waiting for a budget slot, by budget group, kept up to date from the ids the cache says
    changed (central.store.active_events) instead of found by scanning every active event and resolving
    their VMs on each call that frees a slot (thousands waiting in a 100k wave). A vmId's groups never
    change; a name that moves to another vmId keeps its old holder's groups here until the event's row
    changes: the timer's pass, which decides every event, sees the new holder."""

    budgets: Tuple[Budget, ...] = ()
    source: Optional[ActiveEvents] = None  # the cache followed (a reload replaces it: index everything)
    by_event: Dict[str, FrozenSet[str]] = field(default_factory=dict)  # waiting EventId -> its groups
    by_group: Dict[str, Set[str]] = field(default_factory=dict)  # group -> waiting EventIds
    partial: Set[str] = field(default_factory=set)  # waiting events some of whose VMs are not known yet

    def follow(self, state: FleetState, budgets: Tuple[Budget, ...], rows: Rows, planned: Set[str]) -> None:
        """Index the events changed since the last call (all of them after a reload or a policy change)."""
        active = state.active
        changed = active.take_changed() if self.source is active and self.budgets == budgets else None
        was_partial = set(self.partial)
        if changed is None:
            active.take_changed()  # (starts the record of changes from here)
            self.source, self.budgets = active, budgets
            self.by_event, self.by_group, self.partial = {}, {}, set()
            changed = set(active)
        changed |= was_partial  # looked up again: their VMs may be known now
        for event_id in changed:
            self._drop(event_id)
        waiting = [active[e][0] for e in changed if e in active and waits(active[e][0])]
        found = {rec.event_id: rows(rec) for rec in waiting}
        # the VM rows of waiting events no instance cache holds yet (another instance's partition), by key,
        # once. Not the plan's own VMs: their cached ETags are the ones it was made on.
        unknown = [rec for rec in waiting if not found[rec.event_id] and rec.event_id not in was_partial]
        if unknown:
            state.load_vms({v for rec in unknown for v in rec.reported_by.values()} - planned)
            found.update({rec.event_id: rows(rec) for rec in unknown})
        for rec in waiting:
            groups = self.by_event[rec.event_id] = groups_of(budgets, found[rec.event_id])
            for group in groups:
                self.by_group.setdefault(group, set()).add(rec.event_id)
            if len(found[rec.event_id]) < len(rec.resources):
                self.partial.add(rec.event_id)

    def _drop(self, event_id: str) -> None:
        for group in self.by_event.pop(event_id, ()):
            members = self.by_group[group]
            members.discard(event_id)
            if not members:
                del self.by_group[group]
        self.partial.discard(event_id)


def waits(rec: EventRecord) -> bool:
    return rec.state == WAITING_BUDGET and not rec.ended


def freed_waiters(state: FleetState, changes: Changes, budgets: Sequence[Budget],
                  now: datetime, memo: WaitingGroups) -> List[EventRecord]:
    """The committed events waiting for a budget that `changes` frees a slot of (see the module's
    docstring), first seen first, at most one per VM freed and from its own groups. Group facts come from
    the plan's and the cached VM rows (a vmId's groups never change), the missing ones read by key;
    `memo` (the caller's, one per cache: it takes the cache's record of changes) keeps them between calls."""
    if not budgets:
        return []
    freed = [rec for event_id, rec in changes.events.items()
             if event_id in state.active and impacting(state.active[event_id][0], now)
             and not impacting(rec, now)]
    if not freed:
        return []
    planned = {vm.name: vm for vm in changes.vms.values() if vm.name_bound}

    def rows(rec: EventRecord) -> List[VmState]:
        found: List[Optional[VmState]] = [
            planned.get(name) or state.named.get(name) or state.vm(rec.reported_by.get(name, ""))
            for name in rec.resources]
        return [vm for vm in found if vm is not None]

    freed_groups = [found for rec in freed for vm in rows(rec)
                    for found in (groups_of(budgets, [vm]),) if found]
    if not freed_groups:
        return []
    memo.follow(state, tuple(budgets), rows, set(changes.vms))
    sharing_ids = {e for group in frozenset().union(*freed_groups) for e in memo.by_group.get(group, ())}
    current = [state.active[e][0] for e in sharing_ids if e not in changes.events and e in state.active]
    sharing = in_order_of_first_sight(rec for rec in current if waits(rec))
    chosen = set(next_waiters(freed_groups, [(rec.event_id, memo.by_event[rec.event_id]) for rec in sharing]))
    return [rec for rec in sharing if rec.event_id in chosen]


def _keeping_etags(state: FleetState, vm_ids: Iterable[str], read: Callable[[], object]) -> object:
    """`read()` with the cached rows (and ETags) of `vm_ids` as they were before it."""
    ids = list(vm_ids)
    saved = {v: state.vms[v] for v in ids if v in state.vms}
    try:
        return read()
    finally:
        for v in ids:
            if v in saved:
                state.vms[v] = saved[v]
            else:
                state.vms.pop(v, None)


def vms_by_name_over(state: FleetState,
                     planned: Dict[str, VmState]) -> Callable[[Iterable[str]], Dict[str, VmState]]:
    """FleetState.vms_by_name, with the plan's VM rows standing over the stored ones."""

    held = {vm.name for vm in planned.values() if vm.name_bound}  # the plan's row stands for these names

    def read(names: Iterable[str]) -> Dict[str, VmState]:
        wanted = set(names)
        out: Dict[str, VmState] = _keeping_etags(  # type: ignore[assignment]
            state, planned, lambda: state.vms_by_name(wanted - held))
        for vm in planned.values():
            if vm.name not in wanted:
                continue
            if vm.name_bound:
                out[vm.name] = vm
            elif vm.name in out and out[vm.name].vm_id == vm.vm_id:  # its name moved to another vmId
                del out[vm.name]
        return out

    return read


def all_vms_over(state: FleetState, planned: Dict[str, VmState]) -> Callable[[], List[VmState]]:
    """FleetState.all_vms, with the plan's VM rows standing over (or added to) the stored ones."""

    def read() -> List[VmState]:
        stored: List[VmState] = _keeping_etags(state, planned, state.all_vms)  # type: ignore[assignment]
        by_id = {vm.vm_id: vm for vm in stored}
        by_id.update(planned)
        return list(by_id.values())

    return read
