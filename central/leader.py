"""Leader election: which VM carries out the approval of one event.

Deterministic: the first VM in sorted(Resources) whose forwarder is live (sent anything within the
liveness interval) and has not already failed this event (timed out or could not POST). Every
instance computing it from the same facts picks the same VM, as Microsoft's guidance suggests
("the first machine in Resources"), but skipping VMs that cannot act.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Dict, Optional

from .registry import EventRecord
from .vms import VmState

FAILED = ("timeout", "post-failed")


def elect(
    event: EventRecord, vms_by_name: Dict[str, VmState], now: datetime, liveness: timedelta
) -> Optional[VmState]:
    failed = {a.vm_id for a in event.approvals if a.result in FAILED}
    for name in sorted(event.resources):
        vm = vms_by_name.get(name)
        if vm is not None and vm.vm_id not in failed and vm.live(now, liveness):
            return vm
    return None
