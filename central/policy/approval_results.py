"""What an approval result (scheduledevents.approvalresult.v1) does to its event: pure, so the
ingest and a replay tool apply it the same way."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Dict, Optional

from central.model.alert import ALERT_LEASE, Alert
from central.model.events import Approval, EventRecord
from central.model.times import iso

from .decide import DONE_OUTCOMES, END_OUTCOMES, REFUSED_OUTCOMES, Verdict, record


def apply_result(rec: EventRecord, data: Dict[str, Any], vm_name: str, now: datetime) -> Optional[dict]:
    """Record the outcome on its attempt and the event; returns the decision taken (a refusal stops
    the approval, with a critical alert the event owes), else None. post-failed: the next evaluation
    fails over to another live VM. An end-of-event report (completed, post-hook-failed) is kept apart in
    `rec.ending`: it says how the event ended on that VM, never that it was approved."""
    if data["outcome"] in END_OUTCOMES:
        rec.ending = {"outcome": data["outcome"], "at": iso(now), "vm": vm_name,
                      "reason": str(data.get("reason", ""))[:500]}
        return None
    attempt: Optional[Approval] = None  # None: a local or manual decision on the VM (no message)
    for a in rec.approvals:
        if data.get("messageId") and a.message_id == data["messageId"]:
            attempt = a
    if attempt is not None:
        if attempt.result not in (None, "timeout", "event-started"):
            return None  # already recorded
        attempt.result = data["outcome"]
        attempt.result_at = now
    rec.outcome = data["outcome"]
    rec.outcome_at = now
    rec.outcome_vm = vm_name
    if data["outcome"] in DONE_OUTCOMES:
        rec.state = "approved"
        return None
    if data["outcome"] not in REFUSED_OUTCOMES:
        return None
    reason = f"{vm_name} reported {data['outcome']}: {str(data.get('reason', ''))[:500]}"
    decision = record(
        rec,
        Verdict(
            "record", "approval-failed", "approval-failed", "forwarder", reason, "critical", f"vm:{vm_name}"
        ),
        now,
    )
    key = f"{rec.event_id}:approval-failed"
    if not any(a.get("key") == key for a in rec.pending_alerts):
        rec.pending_alerts.append(
            Alert(
                key,
                "approval-failed",
                "critical",
                f"{rec.event_type} {rec.event_id}: approval failed on {vm_name}",
                f"{data['outcome']}: {str(data.get('reason', ''))[:500]}. The event starts at NotBefore.",
                now,
                rec.event_id,
                rec.status,
                next_try=now + ALERT_LEASE,
            ).to_json()
        )
    return decision
