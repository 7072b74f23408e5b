"""The envelope as central reads it (the contract: schemas/envelope.schema.json): a schema-valid
`Envelope` with the fields central keys on, or a `BadEnvelope` kept whole with its errors. Parsing is
central.intake.parse's; these records travel through every stage after it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Optional

INCARNATION = "scheduledevents.incarnation.v1"
HEARTBEAT = "scheduledevents.heartbeat.v1"
QUARANTINED = "scheduledevents.quarantined.v1"
APPROVAL_RESULT = "scheduledevents.approvalresult.v1"


@dataclass
class Envelope:
    """A schema-valid envelope, with the fields central keys on pulled out."""

    id: str
    type: str
    vm_id: str
    vm_name: str
    time: datetime
    data: Dict[str, Any]
    raw: Dict[str, Any]

    @property
    def vm(self) -> Dict[str, Any]:
        return self.data.get("vm") or {}


@dataclass
class BadEnvelope:
    """A body central could not accept: its text, why, and a stable hash to dedupe replays."""

    text: str
    errors: List[Dict[str, str]]
    sha256: str
    vm_id: Optional[str] = None
    envelope_id: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)
    # vm_id is who sent it as far as central could verify (the sender check passed, or authentication
    # is off); False: only what the body claims, which must never key anything of that VM's
    verified: bool = False
