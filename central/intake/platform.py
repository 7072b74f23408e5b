"""The platform's witness (issue 23): Azure's own Scheduled Events feed, as Event Grid delivers it from the
system topic `Microsoft.ResourceNotifications.MaintenanceResources` into central's platform hub.

Parsing only (pure): a hub message body -> PlatformEvents, or BadEnvelopes (kept whole in Quarantine and
alerted like a bad envelope, never raised into the host's retry). Facts that are known about the feed
(../shared/reference/platform-feed.md):
- a body is one Event Grid event or a JSON array of them (Event Grid schema; the CloudEvents 1.0 form,
  `type`/`time`/`source`, is read the same way);
- the facts live in data.resourceInfo.properties (PascalCase, read case-insensitively): EventId, EventType,
  Resources, NotBefore (RFC 1123, "" once Started), EventStatus, EventSource, DurationInSeconds, Description;
- EventStatus is Scheduled | Started | Completed | Canceled (one "l"); `Cancelled` is read the same. Central
  stores one spelling, "Cancelled" (IMDS-era records and docs use it); the spelling the platform used is kept
  in `said`, and the event view shows it;
- never key off `subject` (its form differs between samples): the event is
  data.resourceInfo.properties.EventId; the owner is data.resourceInfo.id, the ARM id of the scheduled event
  under the Compute resource that owns it (virtualMachines, virtualMachineScaleSets or availabilitySets),
  which is the path ARM acknowledges;
- another event type from the topic is not ours: quarantined as unknown (a filter gone wrong shows).

How Resources name VMs (central matches them by name, as it matches envelopes: central.store names):
- standalone VM: Resources ["<vm name>"], owner .../virtualMachines/<vm name>;
- Flexible scale set: each instance is a VM resource: Resources ["<vm name>"], owner
  .../virtualMachineScaleSets/<set>;
- Uniform scale set: Resources ["<set>_<instanceId>"], the same name IMDS gives the instance (compute.name,
  which its forwarder reports); its ARM id .../virtualMachineScaleSets/<set>/virtualMachines/<instanceId> is
  never used to match;
- availability set: Resources are the VM names; owner .../availabilitySets/<set>.
VM names are unique within a resource group only: a fleet with the same VM name in two resource groups is
matched on name alone, as envelopes are (docs/central.md says so).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Optional, Tuple, Union

from central.intake.bounds import int_problem, key_problem
from central.model.envelope import BadEnvelope
from central.model.owner import Owner, owner_of
from central.model.times import parse

EMITTED = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
STATUSES = {"scheduled": "Scheduled", "started": "Started", "completed": "Completed", "canceled": "Cancelled",
            "cancelled": "Cancelled"}
EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
MAX_BODY = 1_000_000  # bytes of one hub message (Event Hubs' own limit is 1 MiB)
MAX_EVENTS_PER_BODY = 500
MAX_RESOURCES = 1000
@dataclass(frozen=True)
class PlatformEvent:
    grid_id: str  # the Event Grid event's id: a redelivery carries the same one
    event_id: str
    event_type: str
    status: str  # the stored spelling: Scheduled | Started | Completed | Cancelled
    said: str  # the platform's spelling (Canceled)
    resources: Tuple[str, ...]
    not_before: Optional[datetime]
    not_before_text: str
    duration: int
    description: str
    event_source: str
    owner: Optional[Owner]
    event_time: Optional[datetime]
    raw: Dict[str, Any] = field(default_factory=dict, compare=False)

    def as_imds(self) -> Dict[str, Any]:
        """The event in IMDS's shape (what EventRecord.absorb and authz read)."""
        return {"EventId": self.event_id, "EventType": self.event_type, "ResourceType": "VirtualMachine",
                "Resources": list(self.resources), "EventStatus": self.status,
                "NotBefore": self.not_before_text,
                "Description": self.description, "EventSource": self.event_source,
                "DurationInSeconds": self.duration}


Parsed = Union[PlatformEvent, BadEnvelope]


def parse_body(body: Union[bytes, str]) -> List[Parsed]:
    """One hub message -> its events (a JSON array or one object). Never raises."""
    text = body.decode("utf-8", "replace") if isinstance(body, (bytes, bytearray)) else str(body)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BODY:
        return [bad(text[:MAX_BODY // 4], f"a platform message of more than {MAX_BODY} bytes")]
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return [bad(text, f"not JSON: {exc}")]
    except RecursionError:  # (json.loads's own limit on nesting; a real event nests 4 levels)
        return [bad(text[:MAX_BODY // 4], "nested too deeply to read")]
    items = doc if isinstance(doc, list) else [doc]
    if len(items) > MAX_EVENTS_PER_BODY:
        return [bad(text, f"{len(items)} events in one message (at most {MAX_EVENTS_PER_BODY})")]
    return [parse_event(item) for item in items]


def parse_event(item: Any) -> Parsed:
    text = json.dumps(item, separators=(",", ":"), ensure_ascii=False, default=str)
    if not isinstance(item, dict):
        return bad(text, "an Event Grid event must be a JSON object")
    kind = item.get("eventType", item.get("type"))
    grid_id = item.get("id")
    if kind != EMITTED:
        return bad(text, f"not a scheduled event: eventType {str(kind)[:120]!r} (expected {EMITTED})",
                   grid_id)
    if not isinstance(grid_id, str) or not grid_id or len(grid_id) > 256:
        return bad(text, "no Event Grid id (a string of 1-256 characters)", grid_id)
    info = _get(_get(item, "data"), "resourceInfo")
    props = _get(info, "properties")
    if not isinstance(props, dict):
        return bad(text, "no data.resourceInfo.properties", grid_id)
    p = {k.lower(): v for k, v in props.items()}
    problems: List[str] = []
    event_id = p.get("eventid")
    if not isinstance(event_id, str) or not 1 <= len(event_id) <= 128:
        problems.append("EventId missing or not a string of 1-128 characters")
    elif bad_key := key_problem(event_id, "EventId"):  # (it becomes part of a State row's key)
        problems.append(bad_key)
    said = p.get("eventstatus")
    status = STATUSES.get(str(said).lower()) if isinstance(said, str) else None
    if status is None:
        problems.append(f"EventStatus {str(said)[:40]!r} is none of Scheduled, Started, Completed, Canceled")
    event_type = p.get("eventtype")
    if event_type not in EVENT_TYPES:
        problems.append(f"EventType {str(event_type)[:40]!r} is none of {', '.join(EVENT_TYPES)}")
    resources = p.get("resources")
    names_ok = isinstance(resources, list) and all(isinstance(r, str) and 0 < len(r) <= 256
                                                   for r in resources)
    if not names_ok or len(resources) > MAX_RESOURCES:
        problems.append(f"Resources must be a list of at most {MAX_RESOURCES} VM names")
    nb_text = p.get("notbefore") or ""
    not_before = None
    if not isinstance(nb_text, str):
        problems.append("NotBefore must be a string")
        nb_text = ""
    elif nb_text:
        not_before = parse(nb_text)
        if not_before is None:
            problems.append(f"NotBefore {nb_text[:40]!r} is not a date")
    duration = p.get("durationinseconds", -1)
    if not isinstance(duration, int) or isinstance(duration, bool):
        duration = -1
    elif too_big := int_problem(duration, "DurationInSeconds"):  # (stored as a 64-bit integer)
        problems.append(too_big)
    if problems:
        return bad(text, "; ".join(problems), grid_id)
    owner_id = _get(info, "id")
    time_text = item.get("eventTime", item.get("time"))
    return PlatformEvent(
        grid_id=grid_id, event_id=str(event_id), event_type=str(event_type), status=str(status),
        said=str(said), resources=tuple(sorted(set(resources))), not_before=not_before,
        not_before_text=nb_text,
        duration=duration, description=str(p.get("description") or "")[:4096],
        event_source=str(p.get("eventsource") or "Platform")[:40], owner=owner_of(owner_id),
        event_time=parse(time_text) if isinstance(time_text, str) else None, raw=item)


def bad(text: str, message: str, grid_id: Any = None) -> BadEnvelope:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return BadEnvelope(text, [{"path": "/", "message": f"platform event: {message}"[:300]}], digest,
                       vm_id=None, envelope_id=str(grid_id)[:256] if grid_id else None,
                       extra={"source": "platform"})


def _get(doc: Any, key: str) -> Any:
    return doc.get(key) if isinstance(doc, dict) else None
