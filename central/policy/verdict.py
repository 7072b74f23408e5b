"""A decision's verdict and what applying it records (pure): the `Verdict` `decide` returns, whether it is a
new decision, and the decision as the event row and the Decisions log keep it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from central.model.events import EventRecord
from central.model.owner import Owner
from central.model.times import iso
from central.model.vms import VmState


@dataclass(frozen=True)
class Send:
    """Send approval attempt `attempt` to `leader`: the message's action and expiry."""

    leader: VmState
    message_action: str  # approve | hook-then-approve
    expires_at: datetime
    attempt: int


@dataclass(frozen=True)
class ArmSend:
    """Approve through ARM at `owner` (attempt `attempt`): no VM carries it (central.policy.arm_route)."""

    owner: Owner
    expires_at: datetime
    attempt: int


@dataclass(frozen=True)
class Verdict:
    kind: str  # "none" (nothing new) | "record" (a decision, no message) | "send" (a decision + approval)
    action: str = (
        ""  # approve | approve-after-hook | approve-in-window | hold | failover | expired | operator-*
    )
    state: str = ""  # the event's state after it (registry.EventRecord.state)
    rule: str = ""
    reason: str = ""
    severity: str = "info"
    decided_by: str = ""
    send: Optional[Send] = None
    timed_out: bool = False  # the outstanding attempt passed its expiry without a result
    alert: str = ""  # "no-leader": the event owes a critical alert
    timeout_cause: str = ""  # timed_out: the likely cause, for the approval-timeout alert
    arm: Optional[ArmSend] = None  # kind "send" through ARM (then `send` is None)


NOTHING = Verdict("none")
# decidedBy of a decision taken by hand: a signed-in person ("operator:<name> (<object id>)") or an
# integration's named function key ("key:<name>"); central.runtime.operator_access says which.
HAND_DECIDERS = ("operator:", "key:")


def is_new(event: EventRecord, verdict: Verdict) -> bool:
    """A verdict is a new decision unless it repeats the event's last one (the timer re-evaluates
    every few minutes; an unchanged verdict is not a new decision). A decision taken by hand is always
    new: a person acted, even in the last decision's words (a hold after an approve that only lifted an
    earlier one must bind again)."""
    if verdict.kind == "send" or (verdict.kind == "record" and verdict.decided_by.startswith(HAND_DECIDERS)):
        return True
    if verdict.kind == "none":
        return False
    return not (event.state == verdict.state and event.decision.get("reason") == verdict.reason)


def shadow_record(event: EventRecord, verdict: Verdict, now: datetime) -> Optional[dict]:
    """A shadow policy's verdict as the event records it (never acted on); None when it says nothing new
    (nothing to decide, or the same as the shadow's last verdict)."""
    if verdict.kind == "none":
        return None
    if event.shadow.get("state") == verdict.state and event.shadow.get("reason") == verdict.reason:
        return None
    send = verdict.send
    return {
        "action": verdict.action,
        "state": verdict.state,
        "rule": verdict.rule,
        "reason": verdict.reason,
        "severity": verdict.severity,
        "decidedBy": "shadow:" + verdict.decided_by.split(":", 1)[-1],
        "at": iso(now),
        "wouldSend": send.message_action if send else ("approve" if verdict.arm else None),
        "leaderVmName": send.leader.name if send else (arm_label(verdict) or None),
        "expiresAt": iso(send.expires_at) if send else (iso(verdict.arm.expires_at) if verdict.arm else None),
    }


def arm_label(verdict: Verdict) -> str:
    """"arm:<kind>/<name>" for a verdict through ARM (the leader column of its decision), else ''."""
    return "arm:" + verdict.arm.owner.label() if verdict.arm else ""


def record(event: EventRecord, verdict: Verdict, now: datetime, message_id: Optional[str] = None) -> dict:
    """Apply a decision to the event record (state, decision, sequence) and return the decision."""
    leader = verdict.send.leader if verdict.send else None
    arm = verdict.arm
    event.state = verdict.state
    event.decision_seq += 1
    event.decision = {
        "action": verdict.action,
        "state": verdict.state,
        "rule": verdict.rule,
        "reason": verdict.reason,
        "severity": verdict.severity,
        "decidedBy": verdict.decided_by,
        "at": iso(now),
        "leaderVmId": leader.vm_id if leader else None,
        "leaderVmName": leader.name if leader else (arm_label(verdict) or None),
        "messageId": message_id,
        "expiresAt": iso(verdict.send.expires_at) if verdict.send else (iso(arm.expires_at) if arm else None),
        **({"via": "arm"} if arm else {}),
    }
    return event.decision
