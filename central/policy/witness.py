"""What a witness's word is worth to the disruption budgets (issue 23, point 2). Pure.

Budgets count the VMs an event names (central.policy.fleet_view.FleetView.impacted_vms). Who said so matters:
- the platform (its own feed, central.intake.platform): Azure's word, no VM can forge it. Every named VM
  counts, whether its forwarder reported the event or not;
- a VM alone: its claim names other VMs. Those count only while their own forwarders have had no time to
  report it (`report_grace`, REPORT_GRACE_SECONDS: the forwarder polls IMDS every second, so this bounds its
  publish and the hub's delivery, not its poll), and only for the reporter's first `claims_per_hour` new
  events of its hour (CLAIMS_COUNTED_PER_HOUR): whatever the ids, one VM holds other VMs' budgets for at most
  claims_per_hour x report_grace an hour. The VMs that reported it themselves, or whose forwarders are silent
  (they cannot report: assume the worst), count as before;
- in an opted-in scope (PLATFORM_CONFIRM_SCOPES: the VMs' ARM id prefixes whose events Azure also
  publishes), an event the platform has not emitted within `confirm_grace` of its first sight
  (PLATFORM_CONFIRM_GRACE_SECONDS) is unconfirmed: it counts toward no budget, and central alerts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Sequence, Tuple

from central.model.events import EventRecord
from central.model.vms import VmState


@dataclass(frozen=True)
class WitnessRules:
    report_grace: timedelta = timedelta(seconds=120)
    claims_per_hour: int = 4
    confirm_scopes: Tuple[str, ...] = ()  # lower-case ARM id prefixes: /subscriptions/<id>/resourcegroups/rg
    confirm_grace: timedelta = timedelta(seconds=300)

    def opted_in(self, vm: VmState) -> bool:
        rid = vm.resource_id.lower()
        return any(rid == s or rid.startswith(s.rstrip("/") + "/") for s in self.confirm_scopes)


def scopes(text: str) -> Tuple[str, ...]:
    """PLATFORM_CONFIRM_SCOPES -> the prefixes (comma-separated ARM ids; empty: none)."""
    return tuple(s.strip().lower().rstrip("/") for s in text.split(",") if s.strip())


def unconfirmed(event: EventRecord, named: Sequence[VmState], rules: WitnessRules, now: datetime) -> bool:
    """Only VMs reported it, a VM it names is opted in, and the platform has not emitted it in time."""
    return (not event.platform and bool(rules.confirm_scopes) and now - event.first_seen > rules.confirm_grace
            and any(rules.opted_in(vm) for vm in named))


def claim_counts(event: EventRecord, rules: WitnessRules) -> bool:
    """The reporter's claim about the other VMs it names counts (within its hourly allowance)."""
    rank = event.claim.get("rank") if event.claim else None
    return not isinstance(rank, int) or rank <= rules.claims_per_hour


def counted(event: EventRecord, named: Sequence[VmState], rules: WitnessRules, now: datetime,
            liveness: timedelta) -> list:
    """The named VMs that count against budgets now."""
    if event.platform:
        return list(named)
    if unconfirmed(event, named, rules, now):
        return []
    if now - event.first_seen <= rules.report_grace and claim_counts(event, rules):
        return list(named)
    return [vm for vm in named if vm.vm_id in event.listed_by or vm.vm_id in event.reported_by.values()
            or not vm.live(now, liveness)]
