"""Leader election: which VM carries out the approval of one event.

Deterministic: the first VM in sorted(Resources) whose forwarder is live (sent anything within the
liveness interval) and has not already failed this event (timed out or could not POST); once every
live VM has failed, another round goes to those that only timed out (never past NotBefore). Every
instance computing it from the same facts picks the same VM, as Microsoft's guidance suggests
("the first machine in Resources"), but skipping VMs that cannot act.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import AbstractSet, Mapping, Optional

from central.model.events import Approval, EventRecord
from central.model.times import iso
from central.model.vms import VmState

FAILED = ("timeout", "post-failed")


def elect(
    event: EventRecord, vms_by_name: Mapping[str, VmState], now: datetime, liveness: timedelta,
    timed_out: AbstractSet[str] = frozenset(),
) -> Optional[VmState]:
    """`timed_out`: vmIds whose attempt just expired (not yet recorded on the event)."""
    live = [
        vms_by_name[n]
        for n in sorted(event.resources)
        if n in vms_by_name and vms_by_name[n].live(now, liveness)
    ]
    for vm in live:
        if fresh(event, vm, timed_out):
            return vm
    # every live VM already had a try: go round again among those that only timed out (a message
    # that was lost, or a forwarder that was restarting); approving twice is harmless for IMDS
    refused = {a.vm_id for a in event.approvals if a.result == "post-failed"}
    for vm in live:
        if vm.vm_id not in refused:
            return vm
    return None


def fresh(event: EventRecord, vm: VmState, timed_out: AbstractSet[str] = frozenset()) -> bool:
    """`vm` has not failed this event yet (elect's first round): once none is, the failover among the named
    VMs has run out and ARM may take over (central.policy.arm_route)."""
    return vm.vm_id not in timed_out and not any(a.vm_id == vm.vm_id and a.result in FAILED
                                                 for a in event.approvals)


def timeout_cause(attempt: Approval, vm: Optional[VmState], now: datetime, liveness: timedelta) -> str:
    """Why an approval message most likely went unanswered until it expired, from what central knows:
    whether it was ever enqueued and whether the VM's forwarder has been heard from since."""
    name, queue = attempt.vm_name, attempt.queue
    if attempt.via == "arm":
        return (f"the ARM acknowledge at {name} was never answered: ARM was unreachable or throttling (see "
                "the arm-unavailable alert), or the instance that committed it stopped before calling and no "
                "other took it over in time (see the Functions logs)")
    if not attempt.sent:
        return (f"the message to {name} was never enqueued: the instance that committed it stopped before "
                "sending and no other took it over in time (see the Functions logs for a crash or a "
                f"Storage outage on queue {queue})")
    if vm is None or not vm.live(now, liveness):
        since = iso(vm.last_seen) if vm is not None and vm.last_seen is not None else "never"
        return (f"{name}'s forwarder is silent (last heard {since}): it is stopped, crashing or cut off "
                f"from Event Hubs, so it did not read queue {queue}; check the se-forwarder service on "
                f"{name}")
    return (f"{name}'s forwarder is alive (last heard {iso(vm.last_seen)}) but never answered: most likely "
            f"it cannot read queue {queue} (its identity lacks Storage Queue Data Message Processor on that "
            "queue: the forwarder install not run for this VM, or the role not yet propagated; "
            f"`se-forwarder check` on {name} says), or something else with rights on the queue received and "
            f"deleted the message, or {name}'s IMDS no longer listed the event as Scheduled for it")
