"""An operator's decisions as pure verdicts (the HTTP routes' approve, hold and release): who decided is
recorded as decidedBy "operator:<name>" (a signed-in person) or "key:<name>" (an integration's named key)
with rule "operator" (decide.OPERATOR_RULE), like every decision."""

from __future__ import annotations

from datetime import datetime

from central.model.alert import ALERT_LEASE, Alert
from central.model.events import EventRecord
from central.model.times import iso

from .decide import HAND_DECIDERS, NOTHING, OPERATOR_RULE, DecideConfig, Verdict, approval
from .fleet_view import FleetView

OPERATOR_ACTIONS = ("approve", "hold", "release")


def decider(operator: str) -> str:
    """decidedBy for a decision by hand: as given when it already says "operator:" or "key:", else a
    person's name ("operator:<name>")."""
    return operator if operator.startswith(HAND_DECIDERS) else f"operator:{operator}"


def operator_approve(
    event: EventRecord, fleet: FleetView, now: datetime, config: DecideConfig, operator: str, reason: str,
    hook: bool = False, via_arm: bool = False, was_held: bool = False,
) -> Verdict:
    """An operator's approve: now, to the elected leader, windows and budgets aside; `hook`: the VM runs its
    pre-approve hook (drain) first; `via_arm`: through ARM instead (no VM, no hook). When an approval is
    already outstanding no second one is sent: kind "none", or, when an operator held the event
    (`was_held`), a recorded release (the hold is lifted: who lifted it is on record and alerted, like every
    operator decision). Check `unapprovable` first."""
    by = decider(operator)
    out = event.outstanding
    if out is not None and now < out.expires_at:
        if not was_held:
            return NOTHING
        why = (f"{reason}; approval {out.attempt} to {out.vm_name} is already outstanding (it expires at "
               f"{iso(out.expires_at)}): no second approval is sent, the hold is lifted")
        return Verdict("record", "operator-release", "approving", OPERATOR_RULE, why, "warning", by)
    return approval(
        event,
        fleet,
        now,
        config,
        "hook-then-approve" if hook else "approve",
        by,
        reason,
        "operator-approve",
        "warning",
        timed_out=event.outstanding is not None,
        via_arm=via_arm,
    )


def operator_hold(event: EventRecord, operator: str, reason: str, now: datetime) -> Verdict:
    """An operator's hold. An attempt committed but never enqueued whose send lease has lapsed is
    revoked with it (`evaluator.apply`); one being sent, or sent, cannot be recalled: the reason says so."""
    by = decider(operator)
    note = ""
    out = event.outstanding
    if out is not None and out.sent:
        note = (
            f"; an approval already sent to {out.vm_name} cannot be recalled "
            f"(it expires at {iso(out.expires_at)})"
        )
    elif out is not None and not out.revocable(now):
        note = (
            f"; approval {out.attempt} to {out.vm_name}, committed {iso(out.sent_at)}, may still be sent by "
            f"the instance sending it until {iso(out.lease_until)} and cannot be recalled; after that it is "
            f"never sent again"
        )
    elif out is not None:
        note = (
            f"; approval {out.attempt} to {out.vm_name} was committed {iso(out.sent_at)} but its sending was "
            f"never confirmed: it is revoked (never sent again), yet it may already be in the queue "
            f"(it expires at {iso(out.expires_at)})"
        )
    return Verdict("record", "operator-hold", "held", OPERATOR_RULE, reason + note, "warning", by)


def operator_release(event: EventRecord, operator: str, reason: str) -> Verdict:
    """Release an operator's hold: the policy decides the event again at once (central.runtime.service)."""
    return Verdict("record", "operator-release", "new", OPERATOR_RULE,
                   reason + "; the policy decides it again", "info", decider(operator))


def operator_alert(rec: EventRecord, verdict: Verdict, who: str, why: str, now: datetime) -> Alert:
    """Every operator decision is alerted: who, what, why (the event owes it, delivered at least once)."""
    what = verdict.action.replace("operator-", "")
    return Alert(
        f"{rec.event_id}:operator:{rec.decision_seq}",
        "operator-decision",
        "info" if what == "release" else "warning",
        f"{who} chose {what} for {rec.event_type} {rec.event_id}",
        f"{who} chose {what}: {why}. {verdict.reason}"[:2000],
        now,
        rec.event_id,
        rec.status,
        facts={"operator": who, "action": what, "reason": why[:500], "eventId": rec.event_id},
        next_try=now + ALERT_LEASE,
    )
