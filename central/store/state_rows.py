"""Records <-> State table entities (the fleet's shared truth; layout in docs/central.md).

One partition, `fleet`, so every change that must hold together commits in one transaction:
  head             Seq: bumped (If-Match) by every change to any event that a decision may read: such
                   event changes are serialised
  book             rewritten (no If-Match) by bookkeeping event changes instead (an attempt marked sent,
                   alerts settled or leased: nothing a decision about another event reads), so caches see them
  vm:<vmId>        a VM: identity, grouping, liveness (central's receive time), applied incarnation,
                   when it first signed (SignedAt: never accepted unsigned again)
  o:<EventId>      an active event: not ended, or ended with alerts still owed
  x:<EventId>      an ended event whose alerts are all delivered (kept: a late report is recognised)
  a:<sha256(key)>  an alert owed that belongs to no event (quarantine, outbox drops), until delivered
  n:<sha256(name)> a VM name's binding to the vmId that holds it (inserted if absent: one holder)
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Dict, List, Optional

from central.model.alert import Alert
from central.model.events import Approval, EventRecord
from central.model.times import aware, parse
from central.model.vms import VmState

from .int64 import plain, whole
from .tables import get_json, put_json

PARTITION = "fleet"
HEAD = "head"
BOOK = "book"
VM = "vm:"
ACTIVE = "o:"
ENDED = "x:"
ALERT = "a:"
NAME = "n:"
ROW_KINDS = (HEAD, BOOK, VM, ACTIVE, ENDED, ALERT, NAME)  # every RowKey starts with one of these


def _dt(value: Any) -> Optional[datetime]:
    """A row's time as a plain UTC datetime: the SDK reads Edm.DateTime as its own subclass (carrying the
    service's text), which central.model.clone cannot take as immutable and deep-copies the slow way: records
    read back from the store (every change another instance made) cost twice as much to copy (issue 24)."""
    if isinstance(value, datetime):
        moment = aware(value)
        return moment if type(moment) is datetime else datetime.combine(moment.date(), moment.timetz())
    return parse(value) if isinstance(value, str) else None


def _drop_none(entity: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in entity.items() if v is not None}


def head_entity(seq: int, at: datetime) -> Dict[str, Any]:
    return {"PartitionKey": PARTITION, "RowKey": HEAD, "Kind": "head", "Seq": whole(seq), "At": at}


def book_entity(at: datetime) -> Dict[str, Any]:
    return {"PartitionKey": PARTITION, "RowKey": BOOK, "Kind": "book", "At": at}


def vm_key(vm_id: str) -> str:
    return VM + vm_id


def event_key(event_id: str, active: bool) -> str:
    return (ACTIVE if active else ENDED) + event_id


def name_key(name: str) -> str:
    return NAME + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def name_entity(name: str, vm_id: str, at: datetime) -> Dict[str, Any]:
    return {"PartitionKey": PARTITION, "RowKey": name_key(name), "Kind": "name", "VmName": name,
            "VmId": vm_id, "BoundAt": at}


def alert_key(key: str) -> str:
    return ALERT + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]


# ---- VMs --------------------------------------------------------------------------------------
def vm_entity(vm: VmState) -> Dict[str, Any]:
    entity: Dict[str, Any] = {
        "PartitionKey": PARTITION,
        "RowKey": vm_key(vm.vm_id),
        "Kind": "vm",
        "VmId": vm.vm_id,
        "VmName": vm.name,
        "ResourceId": vm.resource_id,
        "ScaleSet": vm.scale_set,
        "PlacementGroupId": vm.placement_group,
        "Zone": vm.zone,
        "LastSeen": vm.last_seen,
        "LastHeartbeat": vm.last_heartbeat,
        "ForwarderVersion": vm.forwarder_version,
        "Incarnation": whole(vm.incarnation),
        "IncarnationObservedAt": vm.incarnation_observed,
        "AppliedEnvelope": vm.applied_envelope[:512],
        "OutboxDropped": whole(vm.outbox_dropped),
        "OutboxBacklog": whole(vm.outbox_backlog),
        "HeartbeatLogged": vm.heartbeat_logged,
        "NameBound": vm.name_bound,
        "NewEventsSince": vm.new_events_since,
        "NewEvents": whole(vm.new_events),
        "SignedAt": vm.signed_at,
    }
    put_json(entity, "Tags", vm.tags)
    if vm.group_tags is not None:
        put_json(entity, "GroupTags", vm.group_tags)
    put_json(entity, "ListedEventIds", vm.listed)
    return _drop_none(entity)


def vm_from_entity(e: Dict[str, Any]) -> VmState:
    return VmState(
        vm_id=e["VmId"],
        name=e.get("VmName", ""),
        resource_id=e.get("ResourceId", ""),
        scale_set=e.get("ScaleSet", ""),
        placement_group=e.get("PlacementGroupId", ""),
        zone=e.get("Zone", ""),
        tags=get_json(e, "Tags", {}) or {},
        group_tags=_bound_tags(e),
        last_seen=_dt(e.get("LastSeen")),
        last_heartbeat=_dt(e.get("LastHeartbeat")),
        forwarder_version=e.get("ForwarderVersion", ""),
        incarnation=plain(e.get("Incarnation")),
        incarnation_observed=_dt(e.get("IncarnationObservedAt")),
        applied_envelope=e.get("AppliedEnvelope", ""),
        listed=get_json(e, "ListedEventIds", []) or [],
        outbox_dropped=int(plain(e.get("OutboxDropped"), 0)),
        outbox_backlog=int(plain(e.get("OutboxBacklog"), 0)),
        heartbeat_logged=_dt(e.get("HeartbeatLogged")),
        name_bound=bool(e.get("NameBound", True)),
        new_events_since=_dt(e.get("NewEventsSince")),
        new_events=int(plain(e.get("NewEvents"), 0)),
        signed_at=_dt(e.get("SignedAt")),
    )


def _bound_tags(e: Dict[str, Any]) -> Dict[str, str]:
    """The tags budget groups read. A row written before GroupTags existed: its stored tags are bound
    from now on (an empty GroupTags, a VM first seen without tags, stays empty)."""
    bound = get_json(e, "GroupTags", None)
    return bound if isinstance(bound, dict) else (get_json(e, "Tags", {}) or {})


# ---- events -----------------------------------------------------------------------------------
def event_entity(rec: EventRecord, active: bool) -> Dict[str, Any]:
    last = rec.approvals[-1] if rec.approvals else None
    entity: Dict[str, Any] = {
        "PartitionKey": PARTITION,
        "RowKey": event_key(rec.event_id, active),
        "Kind": "event",
        "EventId": rec.event_id,
        "EventType": rec.event_type,
        "EventSource": rec.event_source,
        "ResourceType": rec.resource_type,
        "Status": rec.status,
        "State": rec.state,
        "FirstSeen": rec.first_seen,
        "NotBefore": rec.not_before,
        "NotBeforeText": rec.not_before_text[:256],
        "DurationInSeconds": whole(rec.duration),
        "Description": rec.description[:4096],
        "EverStarted": rec.ever_started,
        "Ended": rec.ended,
        "EndedAt": rec.ended_at,
        "OperatorHold": rec.operator_hold,
        "HoldSeq": whole(rec.hold_seq),
        "DecisionSeq": rec.decision_seq,
        "ShadowSeq": rec.shadow_seq,
        "DecisionAction": rec.decision.get("action", ""),
        "DecisionRule": rec.decision.get("rule", ""),
        "DecisionReason": str(rec.decision.get("reason", ""))[:4000],
        "Severity": rec.decision.get("severity", ""),
        "ApprovalCount": len(rec.approvals),
        "LeaderVmId": last.vm_id if last else "",
        "LeaderVmName": last.vm_name if last else "",
        "ApprovalSentAt": last.sent_at if last else None,
        "Outcome": rec.outcome or "",
        "OutcomeAt": rec.outcome_at,
        "OutcomeVm": rec.outcome_vm,
        "ReporterCount": len(rec.reported_by),
        "PendingAlertCount": len(rec.pending_alerts),
    }
    put_json(entity, "Resources", rec.resources)
    put_json(entity, "ReportedBy", rec.reported_by)
    put_json(entity, "ListedBy", rec.listed_by)
    put_json(entity, "History", rec.history[-50:])
    put_json(entity, "Decision", rec.decision)
    put_json(entity, "Shadow", rec.shadow)
    put_json(entity, "Approvals", [a.to_json() for a in rec.approvals])
    put_json(entity, "PendingAlerts", rec.pending_alerts)
    put_json(entity, "Ending", rec.ending)
    put_json(entity, "Platform", rec.platform)
    put_json(entity, "Claim", rec.claim)
    return _drop_none(entity)


def event_from_entity(e: Dict[str, Any]) -> EventRecord:
    rec = EventRecord(event_id=e["EventId"], first_seen=_dt(e["FirstSeen"]))  # type: ignore[arg-type]
    rec.event_type = e.get("EventType", "")
    rec.event_source = e.get("EventSource", "Platform")
    rec.resource_type = e.get("ResourceType", "VirtualMachine")
    rec.status = e.get("Status", "Scheduled")
    rec.state = e.get("State", "new")
    rec.not_before = _dt(e.get("NotBefore"))
    rec.not_before_text = e.get("NotBeforeText", "")
    rec.duration = int(plain(e.get("DurationInSeconds"), -1))
    rec.description = e.get("Description", "")
    rec.ever_started = bool(e.get("EverStarted"))
    rec.ended_at = _dt(e.get("EndedAt"))
    rec.operator_hold = bool(e.get("OperatorHold"))
    rec.hold_seq = int(plain(e.get("HoldSeq"), 0))
    rec.decision_seq = int(e.get("DecisionSeq", 0))
    rec.shadow_seq = int(e.get("ShadowSeq", 0))
    rec.outcome = e.get("Outcome") or None
    rec.outcome_at = _dt(e.get("OutcomeAt"))
    rec.outcome_vm = e.get("OutcomeVm", "")
    rec.resources = get_json(e, "Resources", []) or []
    rec.reported_by = get_json(e, "ReportedBy", {}) or {}
    rec.listed_by = get_json(e, "ListedBy", []) or []
    rec.history = get_json(e, "History", []) or []
    rec.decision = get_json(e, "Decision", {}) or {}
    rec.shadow = get_json(e, "Shadow", {}) or {}
    rec.approvals = [Approval.from_json(a) for a in get_json(e, "Approvals", []) or []]
    rec.pending_alerts = get_json(e, "PendingAlerts", []) or []
    rec.ending = get_json(e, "Ending", {}) or {}
    rec.platform = get_json(e, "Platform", {}) or {}
    rec.claim = get_json(e, "Claim", {}) or {}
    return rec


# ---- alerts owed by no event ------------------------------------------------------------------
def alert_row(alert: Alert) -> Dict[str, Any]:
    entity: Dict[str, Any] = {
        "PartitionKey": PARTITION,
        "RowKey": alert_key(alert.key),
        "Kind": "alert",
        "Key": alert.key[:1000],
        "NextTry": alert.next_try,
    }
    put_json(entity, "Alert", alert.to_json())
    return _drop_none(entity)


def alert_from_row(e: Dict[str, Any]) -> Optional[Alert]:
    data = get_json(e, "Alert")
    return Alert.from_json(data) if isinstance(data, dict) else None


# ---- readers outside central (analytics, the demo, tests) --------------------------------------
STATE_VIEWS = {"Events": "event", "Vms": "vm", "OwedAlerts": "alert"}


def read_table(service: Any, prefix: str, name: str) -> List[Dict[str, Any]]:
    """A table's rows by its old name: "Events" and "Vms" are those kinds of the State table's rows,
    anything else the log table itself. A table not created yet reads as empty."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        if name in STATE_VIEWS:
            client = service.get_table_client(prefix + "State")
            return [dict(e) for e in client.query_entities(f"Kind eq '{STATE_VIEWS[name]}'")]
        return [dict(e) for e in service.get_table_client(prefix + name).list_entities()]
    except ResourceNotFoundError:
        return []
