"""The event registry: one record per EventId across all VMs that report it.

Status only moves forward (Scheduled -> Started -> Completed | Cancelled), so a lagging VM's older
document never regresses an event. An event ends when no VM that reported it lists it any more:
Completed if it was ever seen Started, else Cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .times import iso, parse

RANK = {"Scheduled": 0, "Started": 1, "Completed": 2, "Cancelled": 2}
# Real events move on: Azure starts a Scheduled event at NotBefore and removes a Started one ~10 minutes
# later. One still listed well past that was made up (or IMDS lost it): central ends it (timer).
STALE_SCHEDULED = timedelta(hours=1)  # after NotBefore
STALE_STARTED = timedelta(hours=12)  # after it was first seen Started
# An unsent attempt may be enqueued only by the instance holding its send lease, and only while at least
# SEND_MARGIN of it is left; a hold revokes an unsent attempt whose lease has lapsed (docs/central.md).
SEND_LEASE = timedelta(seconds=30)
SEND_MARGIN = timedelta(seconds=10)
MAX_RESOURCES = 1000  # the union of every reporter's Resources (limits.MAX_RESOURCES_PER_EVENT each)
ARM_PREFIX = "arm:"  # an ARM attempt's vm_name: "arm:" + the owner's label (a queue attempt names a VM)


def spellings(event_id: str) -> Tuple[str, ...]:
    """An EventId as given, then its other cases: a GUID that IMDS writes upper-case and Event Grid (and
    people pasting it) lower-case names one event."""
    return tuple(dict.fromkeys((event_id, event_id.upper(), event_id.lower())))


@dataclass
class Approval:
    """One approval message sent (an attempt), and what became of it."""

    attempt: int
    message_id: str
    vm_id: str
    vm_name: str
    queue: str
    action: str  # approve | hook-then-approve
    decided_by: str
    sent_at: datetime
    expires_at: datetime
    result: Optional[str] = None  # outcome from an approvalresult envelope, or "timeout"
    result_at: Optional[datetime] = None
    sent: bool = True  # False between the attempt's commit and the queue send (crash-safe re-send)
    message: Optional[Dict[str, Any]] = None  # the message itself while unsent (re-sent as is)
    lease_until: Optional[datetime] = None  # while unsent: whoever committed this lease may enqueue it
    # never sent again (an operator held the event): it may still be in the VM's queue (its sender may
    # have died between the send and recording it), so it stays outstanding until it expires
    revoked: bool = False
    # how it is carried out: "queue" (the leader VM's forwarder POSTs to IMDS) or "arm" (central acknowledges
    # through ARM at the owning Compute resource: vm_name is "<kind>/<name>", message the call, vm_id "")
    via: str = "queue"

    def may_send(self, now: datetime) -> bool:
        """The lease holder may enqueue the message now (unsent, not revoked, lease not about to end)."""
        return (
            not self.sent
            and self.result is None
            and not self.revoked
            and self.message is not None
            and self.lease_until is not None
            and now < self.lease_until - SEND_MARGIN
        )

    def revocable(self, now: datetime) -> bool:
        """Unsent and nobody holds a lease to send it: a hold can take it back."""
        return (
            not self.sent
            and self.result is None
            and not self.revoked
            and (self.lease_until is None or now >= self.lease_until)
        )

    def to_json(self) -> Dict[str, Any]:
        return {
            "attempt": self.attempt,
            "messageId": self.message_id,
            "vmId": self.vm_id,
            "vmName": self.vm_name,
            "queue": self.queue,
            "action": self.action,
            "decidedBy": self.decided_by,
            "sentAt": iso(self.sent_at),
            "expiresAt": iso(self.expires_at),
            "result": self.result,
            "resultAt": iso(self.result_at) if self.result_at else None,
            "sent": self.sent,
            **({"message": self.message} if self.message is not None and not self.sent else {}),
            **({"leaseUntil": iso(self.lease_until)} if self.lease_until and not self.sent else {}),
            **({"revoked": True} if self.revoked else {}),
            **({"via": self.via} if self.via != "queue" else {}),
        }

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Approval:
        return cls(
            d["attempt"],
            d["messageId"],
            d["vmId"],
            d["vmName"],
            d["queue"],
            d["action"],
            d["decidedBy"],
            parse(d["sentAt"]),
            parse(d["expiresAt"]),  # type: ignore[arg-type]
            d.get("result"),
            parse(d.get("resultAt")),
            bool(d.get("sent", True)),
            d.get("message"),
            parse(d.get("leaseUntil")),
            bool(d.get("revoked", False)),
            str(d.get("via") or "queue"),
        )


@dataclass
class EventRecord:
    event_id: str
    first_seen: datetime
    event_type: str = ""
    event_source: str = "Platform"
    resource_type: str = "VirtualMachine"
    resources: List[str] = field(default_factory=list)
    not_before: Optional[datetime] = None
    not_before_text: str = ""
    duration: int = -1
    description: str = ""
    status: str = "Scheduled"
    history: List[Dict[str, Any]] = field(default_factory=list)  # [{status, at, vm}]
    reported_by: Dict[str, str] = field(default_factory=dict)  # vmName -> vmId
    listed_by: List[str] = field(default_factory=list)  # vmIds whose latest document lists it
    ever_started: bool = False
    decision: Dict[str, Any] = field(default_factory=dict)  # latest: action, rule, reason, severity, at, by
    decision_seq: int = 0
    state: str = "new"  # new | approving | approved | held | waiting-window | starts-at-notbefore
    # | waiting-budget | no-leader | approval-failed | expired | ended
    approvals: List[Approval] = field(default_factory=list)
    outcome: Optional[str] = None
    outcome_at: Optional[datetime] = None
    outcome_vm: str = ""
    operator_hold: bool = False
    ended_at: Optional[datetime] = None
    hold_seq: int = 0  # the State head sequence at which an operator's hold was committed (0: none)
    shadow: Dict[str, Any] = field(default_factory=dict)  # the shadow policy's latest verdict (never sent)
    shadow_seq: int = 0
    # alerts this event owes (kind, status, at, rounds, nextTry, error): durable with the event row,
    # removed once delivered or given up (docs/central.md, "Alerts")
    pending_alerts: List[Dict[str, Any]] = field(default_factory=list)
    # how the event ended on a VM, as its forwarder reported (completed | post-hook-failed, at, vm,
    # reason): not an approval (central.policy.approval_results)
    ending: Dict[str, Any] = field(default_factory=dict)
    # the platform's witness (central.intake.platform_plan): status and spelling it said, first/last heard,
    # the owning Compute resource, its Event Grid ids and transitions. Empty: only VMs reported it
    platform: Dict[str, Any] = field(default_factory=dict)
    # who first claimed it and that VM's count of new events in its hour then (central.policy.witness)
    claim: Dict[str, Any] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.status in ("Completed", "Cancelled")

    @property
    def outstanding(self) -> Optional[Approval]:
        """The approval still awaiting a result, if any (at most one, by construction)."""
        last = self.approvals[-1] if self.approvals else None
        return last if last is not None and last.result is None else None

    def absorb(self, event: Dict[str, Any], vm_id: str, vm_name: str, at: datetime) -> bool:
        """Merge one VM's view of this event. True when the event's status moved forward."""
        self.reported_by.setdefault(vm_name, vm_id)
        if vm_id not in self.listed_by:
            self.listed_by.append(vm_id)
        self.event_type = event.get("EventType", self.event_type)
        self.event_source = event.get("EventSource", self.event_source or "Platform")
        self.resource_type = event.get("ResourceType", self.resource_type)
        if event.get("Resources"):
            self.resources = sorted(set(self.resources) | set(event["Resources"]))[:MAX_RESOURCES]
        if event.get("NotBefore"):
            self.not_before_text = event["NotBefore"]
            self.not_before = parse(event["NotBefore"])
        if isinstance(event.get("DurationInSeconds"), int):
            self.duration = event["DurationInSeconds"]
        self.description = event.get("Description", self.description) or ""
        status = event.get("EventStatus", "Scheduled")
        if status not in RANK:
            status = "Scheduled"
        if status == "Started":
            self.ever_started = True
        if not self.history:
            self.history.append({"status": status, "at": iso(at), "vm": vm_name})
            self.status = status
            return True
        return self.move(status, at, vm_name)

    def move(self, status: str, at: datetime, vm_name: str = "") -> bool:
        if self.ended or RANK[status] <= RANK[self.status]:
            return False
        self.status = status
        self.history.append({"status": status, "at": iso(at), "vm": vm_name})
        return True

    def stale_reason(self, now: datetime) -> str:
        """Why this open event cannot be real any more ('' while it can)."""
        if self.ended:
            return ""
        nb = self.not_before
        if self.status == "Scheduled" and nb is not None and now - nb > STALE_SCHEDULED:
            return f"still Scheduled {STALE_SCHEDULED} after its NotBefore {iso(self.not_before)}"
        started = next((parse(h["at"]) for h in self.history if h.get("status") == "Started"), None)
        if self.status == "Started" and started is not None and now - started > STALE_STARTED:
            return f"still Started {STALE_STARTED} after it started at {iso(started)}"
        return ""

    def end_stale(self, now: datetime) -> None:
        self.move("Completed" if self.ever_started else "Cancelled", now, "central")
        self.ended_at = now
        self.state = "ended"

    def unlisted_by(self, vm_id: str, at: datetime) -> bool:
        """A VM's newer document no longer lists this event. True when that ended the event."""
        if vm_id in self.listed_by:
            self.listed_by.remove(vm_id)
        if self.listed_by or self.ended:
            return False
        self.move("Completed" if self.ever_started else "Cancelled", at)
        self.ended_at = at
        self.state = "ended"
        return True

    def view(self) -> Dict[str, Any]:
        """The JSON view the HTTP API and alerts show."""
        out = self.outstanding
        return {
            "eventId": self.event_id,
            "eventType": self.event_type,
            "eventSource": self.event_source,
            "status": self.status,
            "state": self.state,
            "resources": self.resources,
            "notBefore": iso(self.not_before) if self.not_before else None,
            "durationInSeconds": self.duration,
            "description": self.description,
            "firstSeen": iso(self.first_seen),
            "reportedBy": dict(sorted(self.reported_by.items())),
            "history": self.history,
            "decision": self.decision,
            "leader": (
                {
                    "vmId": out.vm_id,
                    "vmName": out.vm_name,
                    "messageId": out.message_id,
                    "sentAt": iso(out.sent_at),
                    "expiresAt": iso(out.expires_at),
                }
                if out
                else None
            ),
            "approvals": [a.to_json() for a in self.approvals],
            "outcome": self.outcome,
            "ending": self.ending or None,
            # which witness said what, and when (history entries carry `witness: platform` or their vm)
            "witnesses": {"platform": self.platform or None, "vms": dict(sorted(self.reported_by.items()))},
            "operatorHold": self.operator_hold,
            "shadow": self.shadow or None,
            "endedAt": iso(self.ended_at) if self.ended_at else None,
            "pendingAlerts": len(self.pending_alerts),
        }


def in_order_of_first_sight(records: Iterable[EventRecord]) -> List[EventRecord]:
    """Events oldest first (ties by EventId): the order central decides them in, so later events see
    earlier approvals in the budget counts."""
    return sorted(records, key=lambda r: (r.first_seen, r.event_id))
