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
from central.policy.decide import WAITING_BUDGET
from central.policy.fleet_view import impacting
from central.store.fleet_state import Changes, FleetState


def candidates(changes: Changes, touched: Set[str]) -> List[EventRecord]:
    """The planned events to decide: touched by the plan, not ended; in order of first sight."""
    found = [rec for event_id, rec in changes.events.items() if event_id in touched and not rec.ended]
    return in_order_of_first_sight(found)


@dataclass
class WaitingGroups:
    """The budget groups of the events waiting for a slot, each kept while its row is unchanged (the same
    ETag): a vmId's groups never change, and a waiting event's row seldom does, so freeing a slot does not
    resolve the VMs of every waiting event (thousands in a 100k wave) on every call."""

    budgets: Tuple[Budget, ...] = ()
    by_event: Dict[str, Tuple[str, FrozenSet[str]]] = field(default_factory=dict)  # id -> (ETag, groups)


def freed_waiters(state: FleetState, changes: Changes, budgets: Sequence[Budget],
                  now: datetime, memo: Optional[WaitingGroups] = None) -> List[EventRecord]:
    """The committed events waiting for a budget that `changes` frees a slot of (see the module's
    docstring), first seen first, at most one per VM freed and from its own groups. Group facts come from
    the plan's and the cached VM rows (a vmId's groups never change), the missing ones read by key;
    `memo` keeps them between calls."""
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
    in_a_freed_group = frozenset().union(*freed_groups)
    memo = memo if memo is not None else WaitingGroups()
    if memo.budgets != tuple(budgets):
        memo.budgets, memo.by_event = tuple(budgets), {}
    waiting = [(rec, etag) for rec, etag in state.active.values()
               if rec.state == WAITING_BUDGET and not rec.ended and rec.event_id not in changes.events]
    groups: Dict[str, FrozenSet[str]] = {}
    vms_of: Dict[str, List[VmState]] = {}
    for rec, etag in waiting:
        kept = memo.by_event.get(rec.event_id)
        if kept is not None and kept[0] == etag:
            groups[rec.event_id] = kept[1]
        else:
            vms_of[rec.event_id] = rows(rec)
    # the VM rows of waiting events no instance cache holds yet (another instance's partition), by key, once:
    # a vmId's groups never change. Not the plan's own VMs: their cached ETags are the ones it was made on.
    unknown = [rec for rec, _ in waiting if rec.event_id in vms_of and not vms_of[rec.event_id]]
    if unknown:
        state.load_vms({v for rec in unknown for v in rec.reported_by.values()} - set(changes.vms))
        vms_of.update({rec.event_id: rows(rec) for rec in unknown})
    etags = {rec.event_id: etag for rec, etag in waiting}
    for event_id, vms in vms_of.items():
        groups[event_id] = groups_of(budgets, vms)
    # kept for the events now waiting only, and only when every VM they name was found (one found later
    # would add its groups). A name that moves to another vmId keeps its old holder's groups here until
    # the event's row changes: the timer's pass, which decides every event, sees the new holder.
    memo.by_event = {rec.event_id: (etags[rec.event_id], groups[rec.event_id]) for rec, _ in waiting
                     if rec.event_id not in vms_of or len(vms_of[rec.event_id]) == len(rec.resources)}
    sharing = in_order_of_first_sight(rec for rec, _ in waiting
                                      if not groups[rec.event_id].isdisjoint(in_a_freed_group))
    chosen = set(next_waiters(freed_groups, [(rec.event_id, groups[rec.event_id]) for rec in sharing]))
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
