"""The outcome of one approval decision: the `data` of a scheduledevents.approvalresult.v1 envelope."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from ..clock import iso

APPROVED = "approved"
REJECTED = "rejected"
HOOK_FAILED = "hook-failed"
POST_FAILED = "post-failed"
COMPLETED = "completed"
POST_HOOK_FAILED = "post-hook-failed"


@dataclass
class ApprovalResult:
    event_id: str
    outcome: str
    reason: str
    message_id: Optional[str] = None
    decided_by: Optional[str] = None
    hook: Optional[Dict[str, Any]] = None
    at: str = field(default_factory=iso)
    # Additive fields (the schema allows extra properties): the raw message of a rejected/poison one.
    extra: Dict[str, Any] = field(default_factory=dict)

    def data(self, vm: Dict[str, Any]) -> Dict[str, Any]:
        """The envelope `data` object (envelope.schema.json#/$defs/approvalResultData)."""
        out: Dict[str, Any] = {
            "vm": vm,
            "eventId": self.event_id,
            "messageId": self.message_id,
            "outcome": self.outcome,
            "reason": self.reason[:1024],
            "decidedBy": self.decided_by,
            "hook": self.hook,
            "at": self.at,
        }
        out.update(self.extra)
        return out

    def as_record(self) -> Dict[str, Any]:
        """For the ledger (re-reporting the same result on a second pass)."""
        return {
            "eventId": self.event_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "messageId": self.message_id,
            "decidedBy": self.decided_by,
            "hook": self.hook,
            "at": self.at,
            "extra": self.extra,
        }

    @classmethod
    def from_record(cls, record: Dict[str, Any]) -> ApprovalResult:
        return cls(
            event_id=record.get("eventId", ""),
            outcome=record["outcome"],
            reason=record.get("reason", ""),
            message_id=record.get("messageId"),
            decided_by=record.get("decidedBy"),
            hook=record.get("hook"),
            at=record.get("at") or iso(),
            extra=dict(record.get("extra") or {}),
        )
