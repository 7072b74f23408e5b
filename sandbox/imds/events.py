"""One simulated maintenance event and the admin request that creates it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
EVENT_SOURCES = ("Platform", "User")

# Minimum notice from the reference (NotBefore - now when the event first appears), in seconds.
MIN_NOTICE: Dict[str, float] = {
    "Freeze": 900, "Reboot": 900, "Redeploy": 600, "Preempt": 30, "Terminate": 300,
}
# "Started -> removed ~10 min" (reference, typical timing): our default for every type.
DEFAULT_STARTED_SECONDS = 600.0

# Our own wording (the docs quote only the live-migration one).
DESCRIPTIONS: Dict[str, str] = {
    "Freeze": "Virtual machine is being paused because of a memory-preserving Live Migration operation.",
    "Reboot": "Virtual machine is going to be restarted as requested by authorized user.",
    "Redeploy": "Virtual machine is going to be redeployed to a new host because of platform maintenance.",
    "Preempt": "Spot virtual machine is being evicted.",
    "Terminate": "Virtual machine scale set instance is going to be deleted.",
}

# Lifecycle states as the admin API reports them (IMDS itself only shows Scheduled/Started).
SCHEDULED, STARTED, COMPLETED, CANCELLED = "Scheduled", "Started", "Completed", "Cancelled"


@dataclass
class SimEvent:
    event_id: str
    event_type: str
    event_source: str
    resources: List[str]
    audience: List[str]
    description: str
    duration_in_seconds: int
    started_seconds: float
    notice_seconds: float
    state: str = SCHEDULED
    created_at: float = 0.0
    not_before: Optional[float] = None  # real instant; None once Started
    started_at: Optional[float] = None
    gone_at: Optional[float] = None  # real instant it disappears (set when Started)
    ended_at: Optional[float] = None
    approved_by: List[str] = field(default_factory=list)
    # made up by its audience's forwarder (a compromised VM): in their IMDS documents only, never on Azure's
    # side (the platform feed does not emit it; ARM does not know it)
    made_up: bool = False

    @property
    def live(self) -> bool:
        return self.state in (SCHEDULED, STARTED)

    def imds(self, rfc1123_not_before: str) -> Dict[str, Any]:
        """Every field, as the newest api-version shows it."""
        return {
            "EventId": self.event_id, "EventStatus": self.state, "EventType": self.event_type,
            "ResourceType": "VirtualMachine", "Resources": list(self.resources),
            "NotBefore": rfc1123_not_before if self.state == SCHEDULED else "",
            "Description": self.description, "EventSource": self.event_source,
            "DurationInSeconds": self.duration_in_seconds,
        }


def _number(body: Mapping[str, Any], key: str, default: float, minimum: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ValueError(f"'{key}' must be a number >= {minimum}")
    return float(value)


def _names(body: Mapping[str, Any], key: str) -> Optional[List[str]]:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and 0 < len(v) <= 256
                                                           for v in value):
        raise ValueError(f"'{key}' must be a non-empty list of VM names (1..256 characters)")
    return list(dict.fromkeys(value))


def from_request(body: Any, known_vms: Sequence[str]) -> SimEvent:
    """A SimEvent from a POST /admin/events body; raises ValueError with a message naming the field."""
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object")
    event_type = body.get("eventType")
    if event_type not in EVENT_TYPES:
        raise ValueError(f"'eventType' must be one of {list(EVENT_TYPES)}")
    source = body.get("eventSource") or "Platform"
    if source not in EVENT_SOURCES:
        raise ValueError(f"'eventSource' must be one of {list(EVENT_SOURCES)}")
    status = body.get("status") or SCHEDULED
    if status not in (SCHEDULED, STARTED):
        raise ValueError("'status' must be 'Scheduled' or 'Started' (started without being scheduled)")
    resources = _names(body, "resources") or [known_vms[0]]
    audience = _names(body, "audience")
    if audience is None:
        audience = [r for r in resources if r in known_vms]  # Resources may name VMs we do not simulate
    unknown = [a for a in audience if a not in known_vms]
    if unknown or not audience:
        raise ValueError(f"'audience' must name simulated VMs (unknown: {unknown}; known: {list(known_vms)})")
    duration = body.get("durationInSeconds", 5 if event_type == "Freeze" else -1)
    if isinstance(duration, bool) or not isinstance(duration, int) or duration < -1:
        raise ValueError("'durationInSeconds' must be an integer >= -1 (-1 = unknown)")
    description = body.get("description")
    if description is None:
        description = DESCRIPTIONS[event_type]
    if not isinstance(description, str) or len(description) > 4096:
        raise ValueError("'description' must be a string of at most 4096 characters")
    event_id = body.get("eventId") or str(uuid.uuid4()).upper()
    if not isinstance(event_id, str) or len(event_id) > 128:
        raise ValueError("'eventId' must be a string of at most 128 characters")
    return SimEvent(
        event_id=event_id, event_type=event_type, event_source=source, resources=resources,
        audience=audience, description=description, duration_in_seconds=duration,
        started_seconds=_number(body, "startedSeconds", DEFAULT_STARTED_SECONDS, 0),
        notice_seconds=_number(body, "noticeSeconds", MIN_NOTICE[event_type], 0),
        state=status,
        made_up=_flag(body, "madeUp"),
    )


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"'{key}' must be true or false")
    return value
