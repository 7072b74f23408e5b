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
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Callable, Dict, Iterable, Mapping, Optional, Set

from central.intake.authz import NAME_RELEASE
from central.model.vms import VmState


def reusable(vm: Optional[VmState], now: datetime, liveness: timedelta) -> bool:
    """A cached row whose budget facts a fresh read would not change (see the module's docstring)."""
    if vm is None or not vm.name_bound or vm.last_seen is None:
        return False
    return now - vm.last_seen <= min(liveness, NAME_RELEASE)


def reading_fewer(read: Callable[[Iterable[str]], Dict[str, VmState]], cached: Mapping[str, VmState],
                  fresh: Set[str], keep_out: Set[str], now: datetime,
                  liveness: timedelta) -> Callable[[Iterable[str]], Dict[str, VmState]]:
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
