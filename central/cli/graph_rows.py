"""Azure Resource Graph rows -> what-if history (`se-policy whatif --from-resource-graph`). Pure: no I/O.

A row of `maintenanceresources` with type `microsoft.maintenance/scheduledevents` (platform-feed.md,
section 4): `id` (the event's ARM id under its owning Compute resource), `name` (the EventId),
`subscriptionId`, `resourceGroup`, `location`, `zones`, `properties` (EventId, EventType, EventStatus,
NotBefore, Resources, EventSource, DurationInSeconds, Description, as in the Event Grid feed).

What Resource Graph cannot give, and what this module does about it:
- one row per event, updated in place: only the latest status, no per-transition history and no time of
  any transition. Once an event is Started, NotBefore is blank ("" in Microsoft's samples), so a Started,
  Completed or Canceled row carries no time at all;
- no approval: whether or when anyone approved an event is not recorded;
- no tags (the row names VMs, not their tags), and retention is not documented.
So a row with a NotBefore is replayed with the others at its estimated first sight (NotBefore minus the
type's minimum notice, the earliest IMDS shows it); a row without one is `timeless`: the caller decides it
alone (no budget interplay) as of an anchor time it chooses. Every event is compared with "no approval".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Dict, Iterable, List, Mapping, Optional

from central.intake import platform
from central.model.events import EventRecord
from central.model.owner import owner_of
from central.model.times import parse
from central.model.vms import VmState

from .whatif import PastEvent

TYPE = "microsoft.maintenance/scheduledevents"
WITNESS = "resource-graph"
# Minimum notice IMDS gives (scheduled-events-overview.md): the estimate of first sight is NotBefore minus it
MIN_NOTICE = {"Freeze": timedelta(minutes=15), "Reboot": timedelta(minutes=15),
              "Redeploy": timedelta(minutes=10), "Preempt": timedelta(seconds=30),
              "Terminate": timedelta(minutes=5)}
DEFAULT_NOTICE = timedelta(minutes=15)


@dataclass
class GraphHistory:
    timed: List[PastEvent] = field(default_factory=list)  # rows with a NotBefore
    timeless: List[PastEvent] = field(default_factory=list)  # no time in the row: decided alone
    vms: Dict[str, VmState] = field(default_factory=dict)
    statuses: Dict[str, int] = field(default_factory=dict)  # the rows' latest statuses
    skipped: List[str] = field(default_factory=list)  # why each unusable row was left out
    before_since: int = 0  # timed rows first seen before --since

    @property
    def events(self) -> int:
        return len(self.timed) + len(self.timeless)


def notice(event_type: str) -> timedelta:
    return MIN_NOTICE.get(event_type, DEFAULT_NOTICE)


def from_rows(rows: Iterable[Mapping[str, Any]], since: datetime, anchor: datetime) -> GraphHistory:
    """Rows (objectArray form) -> history. `since`: timed events first seen earlier are dropped (a timeless
    row cannot be bounded by time: it is kept). `anchor`: when a timeless event is taken as first seen."""
    out = GraphHistory()
    seen: set = set()
    for number, row in enumerate(rows, 1):
        problem = _problem(row)
        if problem:
            out.skipped.append(f"row {number}: {problem}")
            continue
        props = row["properties"]
        event_id = str(props["EventId"])
        if event_id in seen:  # one row per event; a repeat (paging over a changing table) is dropped
            continue
        seen.add(event_id)
        status = _status(props)
        out.statuses[status] = out.statuses.get(status, 0) + 1
        not_before = parse(props.get("NotBefore")) if props.get("NotBefore") else None
        kind = str(props.get("EventType") or "")
        first_seen = not_before - notice(kind) if not_before else anchor
        if not_before is not None and first_seen < since:
            out.before_since += 1
            continue
        past = _past(row, props, status, first_seen, not_before or anchor + notice(kind))
        (out.timed if not_before is not None else out.timeless).append(past)
        _bind_vms(out.vms, row, past.record.resources)
    return out


def _problem(row: Mapping[str, Any]) -> str:
    if not isinstance(row, Mapping):
        return "not an object"
    if str(row.get("type", TYPE)).lower() != TYPE:
        return f"type {row.get('type')!r} is not a scheduled event"
    props = row.get("properties")
    if not isinstance(props, Mapping):
        return "no properties"
    if not props.get("EventId"):
        return "no EventId"
    resources = props.get("Resources")
    if not isinstance(resources, list) or not resources or not all(isinstance(r, str) for r in resources):
        return f"{props.get('EventId')}: no Resources"
    if _status(props) is None:
        return f"{props.get('EventId')}: unknown EventStatus {props.get('EventStatus')!r}"
    if props.get("NotBefore") and parse(props.get("NotBefore")) is None:
        return f"{props.get('EventId')}: NotBefore {props.get('NotBefore')!r} is not a time"
    return ""


def _past(row: Mapping[str, Any], props: Mapping[str, Any], status: str, first_seen: datetime,
          not_before: datetime) -> PastEvent:
    """The event as it was first reported (Scheduled: the policy decides it), its latest status kept as the
    platform's word; no approval (Resource Graph records none)."""
    rec = EventRecord(event_id=str(props["EventId"]), first_seen=first_seen)
    rec.absorb({"EventType": props.get("EventType") or "",
                "EventSource": props.get("EventSource") or "Platform",
                "ResourceType": props.get("ResourceType") or "VirtualMachine",
                "Resources": list(props["Resources"]), "EventStatus": "Scheduled",
                "DurationInSeconds": props.get("DurationInSeconds"),
                "Description": props.get("Description") or ""}, WITNESS, WITNESS, first_seen)
    rec.reported_by, rec.listed_by = {}, []
    rec.not_before = not_before
    rec.platform = {"status": status, "said": props.get("EventStatus"), "witness": WITNESS,
                    "owner": _owner(row)}
    return PastEvent(rec)


def _owner(row: Mapping[str, Any]) -> Optional[Dict[str, str]]:
    """The resource that owns the event, in the platform feed's shape (central.model.owner)."""
    owner = owner_of(row.get("id"))
    return owner.to_json() if owner else None


def _status(props: Mapping[str, Any]) -> Optional[str]:
    """The status as central stores it (either spelling of cancelled; None: not a status)."""
    return platform.STATUSES.get(str(props.get("EventStatus")).lower())


def _bind_vms(vms: Dict[str, VmState], row: Mapping[str, Any], names: List[str]) -> None:
    """The VMs an event names, with what the row says of them: their scale set (the owner, when it is
    one) and zone (when the row gives exactly one). No tags: Resource Graph's row has none."""
    owner = _owner(row) or {}
    zones = row.get("zones") if isinstance(row.get("zones"), list) else []
    for name in names:
        if name in vms:
            continue
        vm = VmState(f"{WITNESS}:{name}", name)
        by_set = owner.get("kind") == "virtualMachineScaleSets"
        scale_set = owner.get("name", "") if by_set else ""
        vm.bind_identity({"vmScaleSetName": scale_set, "zone": str(zones[0]) if len(zones) == 1 else "",
                          "tags": {}})
        vms[name] = vm
