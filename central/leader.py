"""Leader election: which VM carries out the approval of one event.

Deterministic: the first VM in sorted(Resources) whose forwarder is live (sent anything within the
liveness interval) and has not already failed this event (timed out or could not POST); once every
live VM has failed, another round goes to those that only timed out (never past NotBefore). Every
instance computing it from the same facts picks the same VM, as Microsoft's guidance suggests
("the first machine in Resources"), but skipping VMs that cannot act.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import AbstractSet, Dict, Optional

from .registry import EventRecord
from .vms import VmState

FAILED = ("timeout", "post-failed")


def elect(
    event: EventRecord, vms_by_name: Dict[str, VmState], now: datetime, liveness: timedelta,
    timed_out: AbstractSet[str] = frozenset(),
) -> Optional[VmState]:
    """`timed_out`: vmIds whose attempt just expired (not yet recorded on the event)."""
    live = [
        vms_by_name[n]
        for n in sorted(event.resources)
        if n in vms_by_name and vms_by_name[n].live(now, liveness)
    ]
    failed = {a.vm_id for a in event.approvals if a.result in FAILED} | set(timed_out)
    for vm in live:
        if vm.vm_id not in failed:
            return vm
    # every live VM already had a try: go round again among those that only timed out (a message
    # that was lost, or a forwarder that was restarting); approving twice is harmless for IMDS
    refused = {a.vm_id for a in event.approvals if a.result == "post-failed"}
    for vm in live:
        if vm.vm_id not in refused:
            return vm
    return None
