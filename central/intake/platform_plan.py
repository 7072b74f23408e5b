"""Planning the platform's witness (issue 23): parsed platform events -> the same Plan (State changes, log
rows, alerts) that central.intake.plan makes from envelopes, on copies of the cached rows.

One event, two witnesses: an EventId has one record whoever reported it. What the platform says:
- its facts (EventType, Resources, NotBefore, EventSource, Description, Duration) outrank every VM's: they
  replace what VMs reported, and a VM report made before them that contradicts them raises one
  `platform-contradicts` alert naming the reporters (later VM reports that contradict them are refused by
  central.intake.authz.fact_conflicts, since the record now holds the platform's facts);
- its status moves the event forward only (Scheduled -> Started -> Completed | Cancelled); a redelivery
  (the same Event Grid id) or a regression changes nothing;
- its Completed or Canceled ends the event exactly, also one that VMs still list (their later reports are
  late, never revive it) or one their unlisting already ended with a guess (the guess is corrected);
- every transition is kept on the record (`platform`: what the platform said and when, its Event Grid ids,
  the owning Compute resource), so the event view shows which witness said what, and when.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Container, Dict, List, Optional, Tuple

from central.intake import alerts as ingest_alerts
from central.intake import authz
from central.intake.plan import Plan
from central.intake.platform import Parsed, PlatformEvent
from central.model.alert import ALERT_LEASE, Alert
from central.model.clone import clone_event
from central.model.envelope import BadEnvelope
from central.model.events import RANK, EventRecord, spellings
from central.model.times import iso
from central.store import log_rows as logrows
from central.store.fleet_state import FleetState

log = logging.getLogger("central.ingest")
GRID_IDS_KEPT = 20  # Event Grid ids remembered per event (a redelivery is recognised durably)
TRANSITIONS_KEPT = 10


def plan_platform(state: FleetState, items: List[Tuple[Parsed, datetime]], now: datetime,
                  raised: Optional[Container[str]] = None) -> Plan:
    """The changes these platform events make (nothing is written here)."""
    plan = Plan()
    for parsed, received in items:
        if isinstance(parsed, BadEnvelope):
            plan.count("quarantined")
            plan.quarantined("platform", "")
            plan.log_rows.append(("Quarantine", logrows.quarantine_central(parsed, now)))
            plan.changes.alerts.append(_quarantined(parsed, now))
            continue
        _apply(plan, state, parsed, received, now)
    seen: Container[str] = raised if raised is not None else ()
    fresh: Dict[str, Alert] = {}
    for alert in plan.changes.alerts:
        if alert.key not in seen:
            fresh.setdefault(alert.key, alert)
    plan.changes.alerts = list(fresh.values())
    return plan


def _apply(plan: Plan, state: FleetState, pe: PlatformEvent, received: datetime, now: datetime) -> None:
    said_id = pe.event_id
    pe = replace(pe, event_id=_spelling(plan, state, pe.event_id))
    rec, _ = _event(plan, state, pe.event_id)
    if rec is not None and pe.grid_id in (rec.platform.get("gridIds") or []):
        plan.count("duplicates")  # Event Grid delivers at least once
        return
    if rec is None:
        rec = EventRecord(event_id=pe.event_id, first_seen=received)
        plan.changes.events[pe.event_id] = rec
    elif rec.ended:
        _correct_end(plan, rec, pe, received)
        return
    plan.count("processed")
    contradicted = _take_facts(rec, pe)
    if contradicted:
        plan.changes.alerts.append(_contradiction(rec, contradicted, now))
    moved = _witness(rec, pe, received)
    if said_id != rec.event_id:  # ARM is asked in the platform's own spelling (arm_route.arm_event_id)
        rec.platform["eventId"] = said_id
    if moved:
        out = rec.outstanding
        if rec.status == "Started" and out is not None:
            out.result, out.result_at = "event-started", now
        if rec.ended:
            rec.ended_at, rec.state = received, "ended"
        plan.owed.add(ingest_alerts.owe_status_alert(rec, now))
    elif pe.status in RANK and RANK[pe.status] < RANK[rec.status]:
        plan.count("stale")  # out of order: the event is already further on
    plan.touched.add(pe.event_id)


def _spelling(plan: Plan, state: FleetState, event_id: str) -> str:
    """The EventId as central keeps it: the spelling of a record that exists in any case, else the platform's.
    An EventId is a GUID, the same on both witnesses (docs: "the same as the IMDS EventId"), but Event Grid's
    own samples write it in lower case where IMDS writes upper case: one event must stay one record."""
    for candidate in spellings(event_id):
        if candidate in plan.changes.events:
            return candidate
    rec, _ = state.find_event_any_case(event_id)  # (what an id an operator typed is looked up with)
    return rec.event_id if rec is not None else event_id


def _event(plan: Plan, state: FleetState, event_id: str) -> Tuple[Optional[EventRecord], bool]:
    if event_id in plan.changes.events:
        return plan.changes.events[event_id], True
    rec, active = state.find_event(event_id)
    if rec is None:
        return None, False
    mine = clone_event(rec)  # a deep copy, faster (central.model.clone)
    if active:
        plan.changes.events[event_id] = mine
    return mine, active


def _take_facts(rec: EventRecord, pe: PlatformEvent) -> List[str]:
    """The platform's facts replace the VMs'; what the VMs had said that differs (before the platform
    spoke: afterwards authz refuses it)."""
    contradicted: List[str] = []
    if rec.reported_by and not rec.platform:
        contradicted = authz.fact_conflicts(rec, pe.as_imds())
    rec.event_type = pe.event_type
    rec.event_source = pe.event_source
    rec.resource_type = "VirtualMachine"
    rec.resources = list(pe.resources)
    if pe.not_before_text:
        rec.not_before, rec.not_before_text = pe.not_before, pe.not_before_text
    if pe.duration != -1 or rec.duration == -1:
        rec.duration = pe.duration
    rec.description = pe.description or rec.description
    return contradicted


def _witness(rec: EventRecord, pe: PlatformEvent, received: datetime) -> bool:
    """Record what the platform said; True when the event's status moved forward."""
    p = rec.platform
    ids = (p.get("gridIds") or []) + [pe.grid_id]
    said_at = iso(pe.event_time) if pe.event_time else None
    transitions = (p.get("transitions") or []) + [
        {"said": pe.said, "eventTime": said_at, "receivedAt": iso(received), "gridId": pe.grid_id}]
    before = p.get("status")
    furthest = before if before in RANK and RANK[before] >= RANK[pe.status] else pe.status
    rec.platform = {
        "status": furthest,
        "said": pe.said if furthest == pe.status else p.get("said", pe.said),
        "firstAt": p.get("firstAt") or iso(received),
        "lastAt": iso(received),
        "owner": pe.owner.to_json() if pe.owner else p.get("owner"),
        "gridIds": ids[-GRID_IDS_KEPT:],
        "transitions": transitions[-TRANSITIONS_KEPT:],
    }
    if pe.status == "Started":
        rec.ever_started = True
    entry = {"status": pe.status, "at": iso(received), "vm": "", "witness": "platform"}
    if pe.said != pe.status:
        entry["said"] = pe.said
    if not rec.history:
        rec.status = pe.status
        rec.history.append(entry)
        return True
    if rec.ended or RANK[pe.status] <= RANK[rec.status]:
        return False
    rec.status = pe.status
    rec.history.append(entry)
    return True


def _correct_end(plan: Plan, rec: EventRecord, pe: PlatformEvent, received: datetime) -> None:
    """An ended event (its VMs stopped listing it: Completed if ever seen Started, else Cancelled, a
    guess): the platform's Completed or Canceled says which it was. Anything else about it is late."""
    ends = ("Completed", "Cancelled")
    if pe.status not in ends or rec.platform.get("status") in ends:
        plan.count("late")
        return
    guessed = rec.status
    _witness(rec, pe, received)
    if guessed != pe.status:
        rec.status = pe.status
        entry = {"status": pe.status, "at": iso(received), "vm": "", "witness": "platform",
                 "corrects": guessed}
        if pe.said != pe.status:
            entry["said"] = pe.said
        rec.history.append(entry)
        log.info("event %s ended %s, not %s as its VMs' unlisting suggested", rec.event_id, pe.status,
                 guessed)
    plan.count("processed")
    plan.changes.events[rec.event_id] = rec


def _contradiction(rec: EventRecord, problems: List[str], now: datetime) -> Alert:
    reporters = sorted(rec.reported_by)[:10]
    return Alert(
        f"{rec.event_id}:platform-contradicts",
        "platform-contradicts",
        "warning",
        f"{rec.event_type} {rec.event_id}: a VM's report contradicts the platform's",
        f"{'; '.join(problems)[:1500]}. Reported by {', '.join(reporters)}; central now holds the platform's "
        "facts and refuses VM reports that differ from them.",
        now,
        rec.event_id,
        rec.status,
        facts={"reporters": reporters, "problems": problems[:10]},
        next_try=now + ALERT_LEASE,
    )


def _quarantined(bad: BadEnvelope, now: datetime) -> Alert:
    first = bad.errors[0] if bad.errors else {"path": "/", "message": "?"}
    return Alert(
        f"quarantined:platform:{ingest_alerts.window(now)}",
        "quarantined",
        "warning",
        "Central quarantined a platform event it could not accept",
        f"{first['message']} (the first in this window; every one is kept in the Quarantine table)",
        now,
        facts={"source": "platform", "gridId": bad.envelope_id, "sha256": bad.sha256},
        next_try=now + ALERT_LEASE,
    )

