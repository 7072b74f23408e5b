"""What one VM may tell central (issue 14, item 1): pure rules over an envelope and the shared state.

With sender authentication on (central.intake.sender), an envelope's vmId is the VM that sent it; these rules
then bound what that VM can change:
- it speaks about an event only if the event's Resources name it. IMDS shows every VM of an
  availability set or placement group the events of all of them; a report about a sibling's event is
  not refused, just not applied (the VMs it names report it themselves);
- an event's facts are what its first report said: EventType, EventSource, ResourceType, Resources and
  NotBefore change only as IMDS changes them (NotBefore is "" once Started); a report that differs is
  refused (quarantined and alerted), never applied;
- an approval result counts only from the VM the approval message went to, for that message; a local
  or manual decision (no message) only from a VM the event names;
- a VM's name, once bound to its vmId, stays bound (see central.names).
What a compromised VM can still do is in docs/security.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Dict, List, Optional

from central.model.events import EventRecord
from central.model.times import parse

# A VM name stays bound to the vmId that first used it; another vmId (a VM deleted and made again with
# the same name) may take it once the holder has been silent this long.
NAME_RELEASE = timedelta(hours=1)


def names_reporter(event: Dict[str, Any], vm_name: str) -> bool:
    """The event's Resources name the reporting VM."""
    resources = event.get("Resources")
    return isinstance(resources, list) and vm_name in resources


def fact_conflicts(rec: EventRecord, event: Dict[str, Any]) -> List[str]:
    """How `event` (one VM's report) contradicts the facts `rec` holds from the first report."""
    out: List[str] = []
    for key, have in (
        ("EventType", rec.event_type),
        ("EventSource", rec.event_source),
        ("ResourceType", rec.resource_type),
    ):
        if key in event and event[key] != have:
            out.append(f"{key} {str(event[key])[:40]!r}, first reported as {have!r}")
    resources = event.get("Resources")
    if isinstance(resources, list) and rec.resources and sorted(set(resources)) != sorted(set(rec.resources)):
        added = sorted(set(resources) - set(rec.resources))[:5]
        missing = sorted(set(rec.resources) - set(resources))[:5]
        out.append(f"Resources differ from the first report (added {added}, missing {missing})")
    text = event.get("NotBefore")
    if text and rec.not_before is not None and parse(text) != rec.not_before:
        out.append(f"NotBefore {str(text)[:40]!r}, first reported as {rec.not_before_text!r}")
    return out


def result_problem(rec: EventRecord, data: Dict[str, Any], vm_id: str, vm_name: str) -> str:
    """Why this approval result must not count ('' when it may)."""
    message_id: Optional[str] = data.get("messageId")
    if message_id is None:
        if vm_name in rec.resources:
            return ""
        return f"a local decision about {rec.event_id} from {vm_name}, which its Resources do not name"
    for attempt in rec.approvals:
        if attempt.message_id == message_id:
            if attempt.vm_id != vm_id:
                return (f"the result for approval message {message_id} comes from vmId {vm_id}, but that "
                        f"message was sent to {attempt.vm_name} ({attempt.vm_id})")
            return ""
    return f"no approval message {str(message_id)[:64]!r} was sent for {rec.event_id}"
