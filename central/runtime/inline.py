"""Deciding inside the ingest commit (issue 24): the events an ingest plan touched are decided on the plan's
own working copies, and the decisions go into the same transaction as the changes that caused them. A
batch that brings new events then moves the fleet's head row once instead of twice, so concurrent instances
lose fewer races on it. Correctness is the evaluator's: the transaction carries the head's If-Match, so a
decision commits only if it was taken on the current state of every event; a lost race plans and decides
again on the re-read rows.

What the decision sees of the plan: its events stand over the committed ones (budgets count them), and its
VM rows stand over the ones read from the store (a VM first heard from in this plan is not in the store
yet). Reading VMs for the decision must not move this instance's cached ETags of the VMs the plan writes:
the plan was made on those rows, and an ETag read later would let the commit overwrite a change it never saw.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Set

from central.model.events import EventRecord
from central.model.vms import VmState
from central.store.fleet_state import Changes, FleetState


def candidates(changes: Changes, touched: Set[str]) -> List[EventRecord]:
    """The planned events to decide: touched by the plan, not ended; in order of first sight."""
    found = [rec for event_id, rec in changes.events.items() if event_id in touched and not rec.ended]
    return sorted(found, key=lambda r: (r.first_seen, r.event_id))


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
