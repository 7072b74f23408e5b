"""The three questions, as pure functions of the envelopes (no I/O): easy to test and to reuse.

- notice: how long before NotBefore a maintenance event was first seen by any VM, per event type;
- approval lead: how long before NotBefore an approval was carried out on the VM, per event type;
- events per group per week: distinct EventIds that touched a group's VMs, per ISO week.

An event is one EventId, however many VMs report it (the earliest sighting counts).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Dict, Iterable, List, Optional, Tuple

INCARNATION = "scheduledevents.incarnation.v1"
APPROVAL_RESULT = "scheduledevents.approvalresult.v1"
GROUP_KINDS = ("scaleSet", "placementGroup", "zone", "resourceGroup", "tag:<name>")


def parse_time(text: Optional[str]) -> Optional[datetime]:
    """An envelope time (ISO 8601) or an IMDS NotBefore (RFC 1123, or ISO 8601); None when empty."""
    if not text:
        return None
    try:
        if text[:1].isdigit():
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        else:
            moment = parsedate_to_datetime(text)
    except (ValueError, TypeError, IndexError):
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


@dataclass(frozen=True)
class Sighting:
    event_id: str
    event_type: str
    observed_at: datetime
    not_before: Optional[datetime]  # None once Started (IMDS gives "")
    vm: Dict[str, Any]


@dataclass(frozen=True)
class Stats:
    key: str
    count: int
    median: float
    low: float
    high: float


def sightings(envelopes: Iterable[Dict[str, Any]]) -> List[Sighting]:
    """Every (event, VM, incarnation) sighting in the incarnation envelopes, oldest first."""
    out = []
    for env in envelopes:
        if env.get("type") != INCARNATION:
            continue
        data = env["data"]
        observed = parse_time(data.get("observedAt")) or parse_time(env.get("time"))
        if observed is None:
            continue
        for event in data["document"].get("Events", []):
            out.append(Sighting(event["EventId"], event["EventType"], observed,
                                parse_time(event.get("NotBefore")), data["vm"]))
    return sorted(out, key=lambda s: s.observed_at)


def first_sightings(seen: Iterable[Sighting]) -> Dict[str, Sighting]:
    first: Dict[str, Sighting] = {}
    for sighting in seen:
        if sighting.event_id not in first or sighting.observed_at < first[sighting.event_id].observed_at:
            first[sighting.event_id] = sighting
    return first


def notice_seconds(seen: List[Sighting]) -> List[Tuple[str, str, float]]:
    """(event id, type, seconds from first sighting to NotBefore) for events first seen while Scheduled."""
    return [(s.event_id, s.event_type, (s.not_before - s.observed_at).total_seconds())
            for s in first_sightings(seen).values() if s.not_before is not None]


def approval_lead_seconds(envelopes: Iterable[Dict[str, Any]],
                          seen: List[Sighting]) -> List[Tuple[str, str, float]]:
    """(event id, type, seconds from the approval on the VM to NotBefore) per approved event: the first
    `approved` result counts, against the NotBefore last seen before it (Azure may move NotBefore)."""
    approved: Dict[str, datetime] = {}
    for env in envelopes:
        if env.get("type") != APPROVAL_RESULT or env["data"].get("outcome") != "approved":
            continue
        at = parse_time(env["data"].get("at"))
        event_id = env["data"]["eventId"]
        if at is not None and (event_id not in approved or at < approved[event_id]):
            approved[event_id] = at
    out = []
    for event_id, at in approved.items():
        before = [s for s in seen
                  if s.event_id == event_id and s.not_before is not None and s.observed_at <= at]
        if not before:
            continue
        last = before[-1]  # `seen` is oldest first
        out.append((event_id, last.event_type, (last.not_before - at).total_seconds()))
    return out


def group_of(vm: Dict[str, Any], group_by: str) -> str:
    """The VM's group under `group_by` (one of GROUP_KINDS); "(none)" when the VM has no such group."""
    if group_by.startswith("tag:"):
        value = (vm.get("tags") or {}).get(group_by[4:], "")
    else:
        field = {"scaleSet": "vmScaleSetName", "placementGroup": "placementGroupId", "zone": "zone",
                 "resourceGroup": "resourceGroupName"}.get(group_by)
        if field is None:
            raise ValueError(f"group-by {group_by!r}: expected one of {', '.join(GROUP_KINDS)}")
        value = vm.get(field, "")
    return value or "(none)"


def events_per_group_week(seen: List[Sighting], group_by: str) -> Dict[Tuple[str, str], int]:
    """{(group, ISO week "2026-W09"): distinct EventIds} — an event counts once per group it touched,
    in the week it was first seen anywhere."""
    first = first_sightings(seen)
    groups: Dict[str, set] = {}
    for sighting in seen:
        groups.setdefault(sighting.event_id, set()).add(group_of(sighting.vm, group_by))
    counts: Dict[Tuple[str, str], int] = {}
    for event_id, names in groups.items():
        year, week, _ = first[event_id].observed_at.isocalendar()
        for name in names:
            key = (name, f"{year}-W{week:02d}")
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def by_type(rows: Iterable[Tuple[str, str, float]]) -> List[Stats]:
    """Count, median, min and max of the seconds, per event type."""
    values: Dict[str, List[float]] = {}
    for _event_id, event_type, seconds in rows:
        values.setdefault(event_type, []).append(seconds)
    return [Stats(key, len(v), statistics.median(v), min(v), max(v)) for key, v in sorted(values.items())]
