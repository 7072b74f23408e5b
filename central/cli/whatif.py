"""What a candidate policy would have done with recorded events (`se-policy whatif`): the very `decide`
central runs, replayed over history, compared with what was decided. Pure: no I/O, no clock.

The replay (deterministic: the same history and policy give the same output):
- time advances from the first event's first sight in steps of `step`, stopping at each event's first
  sight (empty stretches are skipped); at each instant every open Scheduled event not yet approved is
  decided, in order of first sight, as central's timer does, with the fleet state of that instant;
- an approval the candidate sends is taken as carried out at once: the event impacts its VMs (budgets)
  from then, for as long as it really did (Started -> gone; DEFAULT_IMPACT when unknown); one never
  approved impacts from NotBefore (Azure starts it then); an event that appeared already Started
  impacts from its first sight and is not decided (as in central);
- every forwarder is taken as live; the VMs' groups and tags are their recorded ones.
An approval central sent that the VM refused (its hook failed, or it rejected the message) is compared
as the decision it was, and shown as refused; the VM's end-of-event report is never an approval.
Compared with reality: approved earlier / later / at the same time (within one step), newly held (the
candidate would not have approved before NotBefore what was approved), newly approved, or the same.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Dict, List, Mapping, Optional, Sequence

from central.model.events import EventRecord
from central.model.times import iso
from central.model.vms import VmState
from central.policy.decide import STARTS_AT_NOTBEFORE, DecideConfig, decide
from central.policy.document import Policy
from central.policy.fleet_view import FleetView

DEFAULT_IMPACT = timedelta(minutes=10)  # Started -> gone, when the history does not say
STEP = timedelta(minutes=1)
LIVE_FOREVER = timedelta(days=36500)
CHANGES = ("earlier", "later", "same", "newly-held", "newly-approved", "not-approved")


@dataclass
class PastEvent:
    """One event as it happened: its facts (as first reported) and what became of it."""

    record: EventRecord
    approved_at: Optional[datetime] = None  # when central (or the VM) approved it; None: never approved
    approved_by: str = ""
    started_at: Optional[datetime] = None
    ended_at: Optional[datetime] = None
    # central's approval that the VM refused (hook-failed, rejected): the policy decided to approve, the
    # VM did not carry it out. Compared as the decision; never counted as an approval
    sent_at: Optional[datetime] = None
    refused: str = ""

    @property
    def impact(self) -> timedelta:
        if self.started_at is not None and self.ended_at is not None and self.ended_at > self.started_at:
            return self.ended_at - self.started_at
        return DEFAULT_IMPACT


@dataclass
class Replayed:
    event_id: str
    event_type: str
    resources: List[str]
    first_seen: datetime
    not_before: Optional[datetime]
    actual_at: Optional[datetime]
    actual_by: str
    actual_sent_at: Optional[datetime] = None  # an approval sent and refused on the VM (PastEvent.sent_at)
    actual_refused: str = ""
    whatif_at: Optional[datetime] = None
    whatif_by: str = ""
    waits: List[str] = field(default_factory=list)  # the candidate's states before it approved, in order
    reason: str = ""  # the candidate's last reason
    change: str = "same"

    def to_json(self) -> Dict[str, Any]:
        def at(moment: Optional[datetime]) -> Optional[str]:
            return iso(moment) if moment else None

        return {
            "eventId": self.event_id, "eventType": self.event_type, "resources": self.resources,
            "firstSeen": iso(self.first_seen), "notBefore": at(self.not_before),
            "actual": {"approvedAt": at(self.actual_at), "by": self.actual_by or None,
                       **({"sentAt": at(self.actual_sent_at), "refusedOnVm": self.actual_refused}
                          if self.actual_refused else {})},
            "whatif": {"approvedAt": at(self.whatif_at), "by": self.whatif_by or None, "waits": self.waits,
                       "reason": self.reason},
            "change": self.change,
            "shiftSeconds": (self.whatif_at - self.actual_at).total_seconds()
            if self.whatif_at and self.actual_at else None,
        }


def replay(past: Sequence[PastEvent], vms: Mapping[str, VmState], policy: Policy,
           config: Optional[DecideConfig] = None, step: timedelta = STEP) -> List[Replayed]:
    """Decide every recorded event again under `policy`; `vms` by name (IMDS's Resources names)."""
    config = config or DecideConfig(liveness=LIVE_FOREVER)
    order = sorted(past, key=lambda p: (p.record.first_seen, p.record.event_id))
    if not order:
        return []
    alive = {name: _live(vm, order[0].record.first_seen) for name, vm in vms.items()}
    recs = {p.record.event_id: _fresh(p) for p in order}
    out = {p.record.event_id: _result(p) for p in order}
    ends: Dict[str, datetime] = {}  # when each event stops impacting in the replay
    for p in order:
        if recs[p.record.event_id].status == "Started":  # unplanned: impacts from first sight
            ends[p.record.event_id] = p.record.first_seen + p.impact
    now = order[0].record.first_seen
    last = max((p.record.not_before or p.record.first_seen) for p in order)
    while now <= last + step:
        _end_due(recs, ends, now)
        open_events = [recs[p.record.event_id] for p in order
                       if p.record.first_seen <= now and not recs[p.record.event_id].ended]
        fleet = FleetView(alive, open_events, config.liveness, rules=config.witness)
        for rec, p in ((recs[p.record.event_id], p) for p in order if p.record.first_seen <= now):
            if rec.ended or rec.state == "approved" or rec.status != "Scheduled":
                continue
            if rec.not_before is not None and now >= rec.not_before:
                ends.setdefault(rec.event_id, rec.not_before + p.impact)  # Azure starts it at NotBefore
                continue
            verdict = decide(rec, fleet, policy, now, config)
            result = out[rec.event_id]
            if verdict.kind == "send":
                rec.state = "approved"  # carried out at once: impacting from now
                fleet.mark_impacting(rec, now)
                result.whatif_at, result.whatif_by = now, verdict.decided_by
                ends[rec.event_id] = now + p.impact
            elif verdict.kind == "record" and (not result.waits or result.waits[-1] != verdict.state):
                result.waits.append(verdict.state)
            if verdict.kind != "none":
                result.reason = verdict.reason
        now = _next_instant(now, step, order, recs)
    for result in out.values():
        result.change = compare(result.actual_at or result.actual_sent_at, result.whatif_at, step)
    return [out[p.record.event_id] for p in order]


def compare(actual: Optional[datetime], whatif: Optional[datetime], step: timedelta = STEP) -> str:
    if actual is None:
        return "newly-approved" if whatif is not None else "not-approved"
    if whatif is None:
        return "newly-held"
    if whatif < actual - step:
        return "earlier"
    if whatif > actual + step:
        return "later"
    return "same"


def summary(results: Sequence[Replayed]) -> Dict[str, int]:
    counts = {change: 0 for change in CHANGES}
    for r in results:
        counts[r.change] += 1
    counts["budgetWaits"] = sum(1 for r in results if "waiting-budget" in r.waits)
    counts["windowWaits"] = sum(1 for r in results if {"waiting-window", STARTS_AT_NOTBEFORE} & set(r.waits))
    counts["events"] = len(results)
    return counts


def table(results: Sequence[Replayed]) -> str:
    """A plain-text table: one line per event, times relative to its first sight."""
    rows = [("EVENT", "TYPE", "VMS", "DECIDED", "WHAT-IF", "CHANGE")]
    for r in results:
        rows.append((r.event_id[:12], r.event_type, vms_cell(r.resources),
                     _when(r.actual_at, r.first_seen, r.not_before) if not r.actual_refused else
                     f"sent +{_span((r.actual_sent_at or r.first_seen) - r.first_seen)}, {r.actual_refused}",
                     _when(r.whatif_at, r.first_seen, r.not_before, r.waits), r.change))
    return aligned(rows)


def vms_cell(resources: Sequence[str]) -> str:
    """An event's VMs in a table cell: the first three, "+" when there are more."""
    return ",".join(resources[:3]) + ("+" if len(resources) > 3 else "")


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows as plain-text columns, each as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)


def whatif_cell(r: Replayed) -> str:
    """What the candidate policy did with the event, relative to its first sight."""
    if r.whatif_at is not None:
        return _when(r.whatif_at, r.first_seen, None, r.waits)
    return "held to NotBefore" + (f" after {'/'.join(r.waits)}" if r.waits else "")


def _when(at: Optional[datetime], first_seen: datetime, not_before: Optional[datetime],
          waits: Sequence[str] = ()) -> str:
    waited = f" after {'/'.join(waits)}" if waits else ""
    if at is not None:
        return f"approved +{_span(at - first_seen)}{waited}"
    if not_before is not None:
        return f"NotBefore +{_span(not_before - first_seen)}{waited or ' (not approved)'}"
    return "not approved" + waited


def _span(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else (f"{rest // 60}m{rest % 60:02d}s" if rest >= 60
                                                        else f"{rest}s")


def _fresh(p: PastEvent) -> EventRecord:
    """The event as first reported: no decision, no approval."""
    rec = copy.deepcopy(p.record)
    rec.state, rec.decision, rec.decision_seq, rec.approvals = "new", {}, 0, []
    rec.operator_hold, rec.outcome, rec.ended_at, rec.pending_alerts = False, None, None, []
    rec.ending = {}
    first = rec.history[0]["status"] if rec.history else "Scheduled"
    rec.status = "Started" if first == "Started" else "Scheduled"
    return rec


def _result(p: PastEvent) -> Replayed:
    r = p.record
    return Replayed(r.event_id, r.event_type, list(r.resources), r.first_seen, r.not_before, p.approved_at,
                    p.approved_by, None if p.approved_at else p.sent_at, "" if p.approved_at else p.refused)


def _live(vm: VmState, start: datetime) -> VmState:
    live = copy.copy(vm)
    live.last_seen = start + LIVE_FOREVER / 2  # every forwarder live for the whole replay
    return live


def _end_due(recs: Dict[str, EventRecord], ends: Dict[str, datetime], now: datetime) -> None:
    for event_id, end in ends.items():
        rec = recs[event_id]
        if not rec.ended and now >= end:
            rec.status = "Completed"


def _next_instant(now: datetime, step: timedelta, order: Sequence[PastEvent],
                  recs: Dict[str, EventRecord]) -> datetime:
    """The next step, or an event's first sight if that comes sooner (central decides at first sight);
    past a stretch with nothing open, straight to the next first sight."""
    nxt = now + step
    later = [p.record.first_seen for p in order if p.record.first_seen > now]
    if not later:
        return nxt
    if not any(p.record.first_seen <= now and not recs[p.record.event_id].ended for p in order):
        return min(later)
    return min(nxt, min(later))
