"""What a call did: the JSON-ready results function_app.py logs and the HTTP routes answer."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Optional

from central.model.times import iso


class UnknownEvent(LookupError):
    """No event with this EventId is known (HTTP 404)."""


class InvalidRequest(ValueError):
    """The operator request cannot be carried out as asked (HTTP 400/409); the message says why."""


@dataclass
class Decision:
    event_id: str
    action: str  # approve | approve-after-hook | approve-in-window | hold | failover | expired | operator-*
    state: str  # the event's state after it (see registry.EventRecord.state)
    rule: str
    reason: str
    severity: str
    decided_by: str
    at: datetime
    leader_vm_id: Optional[str] = None
    leader_vm_name: Optional[str] = None
    message_id: Optional[str] = None
    expires_at: Optional[datetime] = None

    def to_json(self) -> Dict[str, Any]:
        out = asdict(self)
        out["at"] = iso(self.at)
        out["expires_at"] = iso(self.expires_at) if self.expires_at else None
        return out


@dataclass
class BatchResult:
    received: int = 0
    processed: int = 0
    duplicates: int = 0
    stale: int = 0
    quarantined: int = 0
    late: int = 0  # reports about events that ended before (recognised, not revived)
    refused: int = 0  # envelopes part of which a VM may not say (central.intake.authz): quarantined, alerted
    downgrades: int = 0  # unsigned envelopes from VMs that signed before (also counted in quarantined)
    decisions: List[Decision] = field(default_factory=list)
    approvals_sent: int = 0
    alerts_sent: int = 0
    alerts_logged: int = 0  # no webhook configured: delivered to the log only
    alerts_failed: int = 0
    transactions: int = 0
    conflicts: int = 0  # lost races, re-read and decided again
    stale_groups: int = 0  # decisions that read a budget group's deferred changes, then decided again
    errors: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        out = asdict(self)
        out["decisions"] = [d.to_json() for d in self.decisions]
        return out


COUNTERS = (
    "envelopes",
    "duplicates",
    "stale",
    "quarantined",
    "late",
    "refused",
    "downgrades",
    "approvals",
    "alertsSent",
    "alertsLogged",
    "alertsFailed",
    "storeErrors",
    "conflicts",
    "rowsSetAside",
)


def new_counters() -> Dict[str, int]:
    return {k: 0 for k in COUNTERS}
