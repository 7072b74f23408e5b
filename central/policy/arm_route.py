"""When central approves through ARM rather than through a VM's forwarder (issue 23, point 3). Pure.

ARM's Microsoft.Maintenance acknowledge approves an event at its owning Compute resource with no agent
(central.runtime.arm carries it out). Central takes that path:
- (a) agentless VMs: the platform feed reported the event and no VM it names has a forwarder central ever
  heard from. The policy decides with what the platform event gives (below) and ARM approves;
- (b) failover: the failover among the named VMs ran out (no live forwarder left, or every live one already
  had a try and did not carry it out in time): ARM approves instead of the event starting unapproved at
  NotBefore;
- (c) an operator asks for it (`via: "arm"` on the decide route).

The owner is the platform's (data.resourceInfo.id). Without the feed it is derived from the forwarders'
own identity (resourceId, vmScaleSetName): only when every VM the event names is known from its forwarder,
they all have the one owner (a VM, or their scale set) and one of them reported the event itself. IMDS does
not name an availability set, so without the feed an availability set's event has no owner here (its VMs'
ids differ): no ARM path, the event starts at NotBefore as before (with the no-leader alert).

ARM runs no hook: a pre-approve hook needs the VM's forwarder. Approving through ARM an event the policy
wanted drained first is still better than Azure starting it at NotBefore with no drain at all; the decision
says so.

What the policy can match on for an agentless VM: the platform event gives EventType, EventSource,
DurationInSeconds and Resources (vmNames), and its owner's ARM id gives the subscription, the resource
group and, for a scale set's instances, the scale set. Tags, zones and placement groups come only from a
forwarder (IMDS): conditions on them never fit an agentless VM (a rule needing them does not match).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from central.model.events import EventRecord
from central.model.owner import Owner, owner_of
from central.model.vms import VmState

PLATFORM_VM_PREFIX = "platform:"  # vm_id of a VM known only from the platform event (no forwarder)


def platform_owner(event: EventRecord) -> Optional[Owner]:
    return Owner.from_json((event.platform or {}).get("owner"))


def vm_owner(vm: VmState) -> Optional[Owner]:
    """The owner of a forwarder-reported VM's events: its scale set, else the VM itself."""
    own = owner_of(vm.resource_id)
    if own is None:
        return None
    if vm.scale_set:
        return Owner(own.subscription, own.resource_group, "virtualMachineScaleSets", vm.scale_set)
    if own.kind != "virtualMachines":  # a Uniform instance's id: .../virtualMachineScaleSets/<set>/...
        return own
    return Owner(own.subscription, own.resource_group, "virtualMachines", vm.name)


def arm_owner(event: EventRecord, vms: Sequence[VmState]) -> Optional[Owner]:
    """Where ARM acknowledges `event`: the platform's owner; else, when central knows a forwarder for every
    VM it names, their one common owner, provided one of them reported the event itself (None: unknown,
    or the VMs have different owners: standalone VMs, or an availability set, which IMDS does not name)."""
    found = platform_owner(event)
    if found is not None:
        return found
    reporters = set(event.reported_by.values())
    if not vms or len({vm.name for vm in vms}) < len(set(event.resources)):
        return None
    if not any(vm.vm_id in reporters for vm in vms):
        return None
    owners = {vm_owner(vm) for vm in vms}
    if len(owners) == 1:
        return next(iter(owners))
    return None


def arm_event_id(event: EventRecord) -> str:
    """The EventId as ARM is asked to acknowledge it: the platform's own spelling when it wrote it in another
    case than the record's (central.intake.platform_plan), else the record's (the VMs' IMDS spelling)."""
    return str(event.platform.get("eventId") or event.event_id)


def arm_refused(event: EventRecord) -> bool:
    """ARM refused an approval of this event (most often: central's identity lacks Scheduled Events
    Contributor, which only the platform feed's install grants). It is not asked again unless an operator
    asks: the forwarders of the VMs that reported the event carry the next attempts."""
    return any(a.via == "arm" and (a.result or "").startswith("arm-") for a in event.approvals)


def agentless(event: EventRecord, vms: Sequence[VmState]) -> bool:
    """Known from the platform feed only: no VM it names has a forwarder central knows."""
    return bool(event.platform) and not vms


def platform_vms(event: EventRecord) -> List[VmState]:
    """The VMs of an agentless event as the platform describes them, for rule matching: name, subscription,
    resource group and scale set (from the owner); no tags, zone or placement group."""
    owner = platform_owner(event)
    out = []
    for name in event.resources:
        rid, scale_set = "", ""
        if owner is not None:
            rid = (f"/subscriptions/{owner.subscription}/resourceGroups/{owner.resource_group}"
                   f"/providers/Microsoft.Compute/virtualMachines/{name}")
            scale_set = owner.name if owner.kind == "virtualMachineScaleSets" else ""
        out.append(VmState(PLATFORM_VM_PREFIX + name, name, resource_id=rid, scale_set=scale_set,
                           group_tags={}))
    return out
