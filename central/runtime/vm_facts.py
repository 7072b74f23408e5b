"""Which VM rows a deciding pass may take from this instance's cache instead of the store (issue 24).

A pass reads the VMs of the events it decides (their rules, leader and liveness: always from the store)
and those of every impacting open event (the disruption budgets' counts). At 100k VMs the second set is
thousands of rows, re-read every pass: that read was most of central's cost in a wave. A budget count
takes from a named VM only its vmId and groups (fixed for a vmId), whether it holds its name, and whether
it is live (central.policy.witness.counted). A cached row that shows the VM live now gives the same
answers as a fresh read:
- last_seen only moves forward, so a VM live by its cached row is live by the stored one too;
- a name moves to another vmId only after its holder was silent for authz.NAME_RELEASE (central.intake.plan,
  committed under the old holder's If-Match), so a holder heard from within that time still holds it.
A cached row that shows the VM silent (it may have spoken since) or is older than both bounds is read again.

The same argument tells which budget groups an impacting event's VMs are in without reading them
(`groups_hint`): a pass then reads and counts only the events that may share a group with what it decides,
not every impacting event of the fleet (thousands in a 100k wave).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable, Dict, FrozenSet, Iterable, Iterator, Mapping, Optional, Set

from central.intake.authz import NAME_RELEASE
from central.model.events import EventRecord
from central.model.vms import VmState
from central.policy.budgets import Budget
from central.policy.fleet_view import GroupsHint

Read = Callable[[Iterable[str]], Dict[str, VmState]]  # names -> the current rows of their VMs


def reusable(vm: Optional[VmState], now: datetime, liveness: timedelta) -> bool:
    """A cached row whose budget facts a fresh read would not change (see the module's docstring)."""
    return held_since(vm, now - min(liveness, NAME_RELEASE))


def held_since(vm: Optional[VmState], oldest: datetime) -> bool:
    """`reusable` with its bound given: bound to its name and heard from at `oldest` or later."""
    return vm is not None and vm.name_bound and vm.heard_since(oldest)


def reading_fewer(read: Read, cached: Mapping[str, VmState], fresh: Set[str], keep_out: Set[str],
                  now: datetime, liveness: timedelta) -> Read:
    """`read` (names -> current VM rows), asked only for the names not in `fresh` (always read) or
    `keep_out` (rows a plan stands over) whose cached row is not `reusable`; the rest come from `cached`."""

    def read_some(names: Iterable[str]) -> Dict[str, VmState]:
        wanted = set(names)
        reuse = {n: cached[n] for n in wanted - fresh - keep_out
                 if n in cached and reusable(cached[n], now, liveness)}
        out = read(wanted - set(reuse))
        reuse.update(out)
        return reuse

    return read_some


def groups_hint(cached: Mapping[str, VmState], planned: Mapping[str, VmState], now: datetime,
                liveness: timedelta) -> GroupsHint:
    """A budget's groups of an event's VMs, from the rows a pass would take without a read: the plan's
    (they stand over the stored ones) and the `reusable` cached ones. None when a VM it names has neither."""
    bound = {vm.name: vm for vm in planned.values() if vm.name_bound}
    held = {vm.name for vm in planned.values()}
    oldest = now - min(liveness, NAME_RELEASE)  # `reusable`, its bound computed once for the pass

    def hint(event: EventRecord, budget: Budget) -> Optional[FrozenSet[str]]:
        groups = set()
        for name in event.resources:
            if name in held:
                vm = bound.get(name)
                if vm is None:
                    return None
            else:
                vm = cached.get(name)
                if vm is None or not held_since(vm, oldest):
                    return None
            group = budget.group_of(vm)
            if group:
                groups.add(group)
        return frozenset(groups)

    return hint


class LazyVms(Mapping):
    """The VMs by name, read from the store the first time a decision looks (a pass that decides
    nothing needing VMs reads none): `first` (the names of the events decided), then the names `then` asks
    for given those rows (the impacting events that may share their budget groups). A name outside both is
    read when asked for."""

    def __init__(self, first: Set[str], then: Callable[[Mapping[str, VmState]], Set[str]],
                 read: Read) -> None:
        self._first = first
        self._then = then
        self._read = read
        self._vms: Optional[Dict[str, VmState]] = None
        self._asked: Set[str] = set()

    def _load(self) -> Dict[str, VmState]:
        if self._vms is None:
            self._vms = dict(self._read(self._first))
            self._asked = set(self._first)
            more = self._then(self._vms) - self._asked
            if more:
                self._vms.update(self._read(more))
                self._asked |= more
        return self._vms

    def _find(self, name: str) -> Optional[VmState]:
        vms = self._load()
        if name not in vms and name not in self._asked:
            self._asked.add(name)
            vms.update(self._read([name]))
        return vms.get(name)

    def __getitem__(self, name: str) -> VmState:
        found = self._find(name)
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name: object) -> bool:  # (Mapping's goes through __getitem__ and an exception)
        return isinstance(name, str) and self._find(name) is not None

    def get(self, name: str, default: Optional[VmState] = None) -> Optional[VmState]:  # type: ignore[override]
        found = self._find(name)
        return default if found is None else found

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())
