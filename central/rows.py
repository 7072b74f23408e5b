"""Records <-> Table entities: the column layout downstream analytics reads (docs/central.md)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Dict, Optional

from .alerts import Alert, Delivery
from .envelopes import BadEnvelope, Envelope
from .registry import Approval, EventRecord
from .store import get_json, put_json, safe_key
from .timeutil import aware, iso, parse
from .vms import VmState


def day(moment: datetime) -> str:
    return aware(moment).strftime("%Y-%m-%d")


def month(moment: datetime) -> str:
    return aware(moment).strftime("%Y-%m")


def claim_partition(key: str) -> str:
    return "c" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:2]


def _dt(value: Any) -> Optional[datetime]:
    if isinstance(value, datetime):
        return aware(value)
    return parse(value) if isinstance(value, str) else None


# ---- Incarnations -----------------------------------------------------------------------------
def incarnation_entity(env: Envelope, applied: bool, received: datetime) -> Dict[str, Any]:
    data = env.data
    diff = data.get("diff") or {}
    events = (data.get("document") or {}).get("Events") or []
    entity: Dict[str, Any] = {
        "PartitionKey": day(env.time),
        "RowKey": safe_key(
            f"{env.vm_id}_{data['incarnation']:012d}_{hashlib.sha256(env.id.encode()).hexdigest()[:12]}"
        ),
        "VmId": env.vm_id,
        "VmName": env.vm_name,
        "Incarnation": data["incarnation"],
        "PreviousIncarnation": data.get("previousIncarnation"),
        "Reset": bool(data.get("reset")),
        "Applied": applied,
        "EnvelopeId": env.id,
        "ObservedAt": _dt(data.get("observedAt")) or env.time,
        "EnvelopeTime": env.time,
        "ReceivedAt": received,
        "ApiVersion": data.get("apiVersion", ""),
        "EventCount": len(events),
        "NewCount": len(diff.get("new") or []),
        "ChangedCount": len(diff.get("changed") or []),
        "GoneCount": len(diff.get("gone") or []),
    }
    put_json(entity, "EventIds", [e.get("EventId") for e in events])
    put_json(entity, "Document", data.get("document"))
    return {k: v for k, v in entity.items() if v is not None}


# ---- Quarantine -------------------------------------------------------------------------------
def quarantine_central(bad: BadEnvelope, now: datetime) -> Dict[str, Any]:
    entity: Dict[str, Any] = {
        "PartitionKey": day(now),
        "RowKey": f"central_{bad.sha256[:40]}",
        "Source": "central",
        "VmId": bad.vm_id or "",
        "EnvelopeId": bad.envelope_id or "",
        "Sha256": bad.sha256,
        "ReceivedAt": now,
        "ErrorCount": len(bad.errors),
    }
    put_json(entity, "Errors", bad.errors)
    put_json(entity, "Body", bad.text)
    return entity


def quarantine_forwarder(env: Envelope, now: datetime) -> Dict[str, Any]:
    data = env.data
    digest = data.get("rawSha256") or hashlib.sha256(env.id.encode()).hexdigest()
    entity: Dict[str, Any] = {
        "PartitionKey": day(env.time),
        "RowKey": safe_key(f"forwarder_{env.vm_id}_{digest[:40]}"),
        "Source": "forwarder",
        "VmId": env.vm_id,
        "VmName": env.vm_name,
        "EnvelopeId": env.id,
        "Sha256": digest,
        "ReceivedAt": now,
        "ObservedAt": _dt(data.get("observedAt")) or env.time,
        "ErrorCount": len(data.get("errors") or []),
        "RawTruncated": bool(data.get("rawTruncated")),
    }
    if isinstance(data.get("incarnation"), int):
        entity["Incarnation"] = data["incarnation"]
    put_json(entity, "Errors", data.get("errors"))
    put_json(entity, "Body", data.get("raw", ""))
    return entity


# ---- Vms --------------------------------------------------------------------------------------
def vm_entity(vm: VmState) -> Dict[str, Any]:
    entity: Dict[str, Any] = {
        "PartitionKey": "vm",
        "RowKey": safe_key(vm.vm_id),
        "VmId": vm.vm_id,
        "VmName": vm.name,
        "ResourceId": vm.resource_id,
        "ScaleSet": vm.scale_set,
        "PlacementGroupId": vm.placement_group,
        "Zone": vm.zone,
        "LastSeen": vm.last_seen,
        "LastHeartbeat": vm.last_heartbeat,
        "ForwarderVersion": vm.forwarder_version,
        "Incarnation": vm.incarnation,
        "IncarnationObservedAt": vm.incarnation_observed,
        "OutboxDropped": vm.outbox_dropped,
        "OutboxBacklog": vm.outbox_backlog,
    }
    put_json(entity, "Tags", vm.tags)
    put_json(entity, "ListedEventIds", vm.listed)
    return {k: v for k, v in entity.items() if v is not None}


def vm_from_entity(e: Dict[str, Any]) -> VmState:
    return VmState(
        vm_id=e["VmId"],
        name=e.get("VmName", ""),
        resource_id=e.get("ResourceId", ""),
        scale_set=e.get("ScaleSet", ""),
        placement_group=e.get("PlacementGroupId", ""),
        zone=e.get("Zone", ""),
        tags=get_json(e, "Tags", {}) or {},
        last_seen=_dt(e.get("LastSeen")),
        last_heartbeat=_dt(e.get("LastHeartbeat")),
        forwarder_version=e.get("ForwarderVersion", ""),
        incarnation=e.get("Incarnation"),
        incarnation_observed=_dt(e.get("IncarnationObservedAt")),
        listed=get_json(e, "ListedEventIds", []) or [],
        outbox_dropped=int(e.get("OutboxDropped", 0)),
        outbox_backlog=int(e.get("OutboxBacklog", 0)),
    )


# ---- Events -----------------------------------------------------------------------------------
def event_entity(rec: EventRecord) -> Dict[str, Any]:
    last = rec.approvals[-1] if rec.approvals else None
    entity: Dict[str, Any] = {
        "PartitionKey": rec.partition,
        "RowKey": safe_key(rec.event_id),
        "EventId": rec.event_id,
        "EventType": rec.event_type,
        "EventSource": rec.event_source,
        "ResourceType": rec.resource_type,
        "Status": rec.status,
        "State": rec.state,
        "FirstSeen": rec.first_seen,
        "NotBefore": rec.not_before,
        "NotBeforeText": rec.not_before_text,
        "DurationInSeconds": rec.duration,
        "Description": rec.description[:4096],
        "EverStarted": rec.ever_started,
        "Ended": rec.ended,
        "EndedAt": rec.ended_at,
        "OperatorHold": rec.operator_hold,
        "DecisionSeq": rec.decision_seq,
        "DecisionAction": rec.decision.get("action", ""),
        "DecisionRule": rec.decision.get("rule", ""),
        "DecisionReason": rec.decision.get("reason", ""),
        "Severity": rec.decision.get("severity", ""),
        "ApprovalCount": len(rec.approvals),
        "LeaderVmId": last.vm_id if last else "",
        "LeaderVmName": last.vm_name if last else "",
        "ApprovalSentAt": last.sent_at if last else None,
        "Outcome": rec.outcome or "",
        "OutcomeAt": rec.outcome_at,
        "OutcomeVm": rec.outcome_vm,
        "ReporterCount": len(rec.reported_by),
    }
    put_json(entity, "Resources", rec.resources)
    put_json(entity, "ReportedBy", rec.reported_by)
    put_json(entity, "ListedBy", rec.listed_by)
    put_json(entity, "History", rec.history)
    put_json(entity, "Decision", rec.decision)
    put_json(entity, "Approvals", [a.to_json() for a in rec.approvals])
    return {k: v for k, v in entity.items() if v is not None}


def event_from_entity(e: Dict[str, Any]) -> EventRecord:
    rec = EventRecord(event_id=e["EventId"], first_seen=_dt(e["FirstSeen"]))  # type: ignore[arg-type]
    rec.event_type = e.get("EventType", "")
    rec.event_source = e.get("EventSource", "Platform")
    rec.resource_type = e.get("ResourceType", "VirtualMachine")
    rec.status = e.get("Status", "Scheduled")
    rec.state = e.get("State", "new")
    rec.not_before = _dt(e.get("NotBefore"))
    rec.not_before_text = e.get("NotBeforeText", "")
    rec.duration = int(e.get("DurationInSeconds", -1))
    rec.description = e.get("Description", "")
    rec.ever_started = bool(e.get("EverStarted"))
    rec.ended_at = _dt(e.get("EndedAt"))
    rec.operator_hold = bool(e.get("OperatorHold"))
    rec.decision_seq = int(e.get("DecisionSeq", 0))
    rec.outcome = e.get("Outcome") or None
    rec.outcome_at = _dt(e.get("OutcomeAt"))
    rec.outcome_vm = e.get("OutcomeVm", "")
    rec.partition = e["PartitionKey"]
    rec.resources = get_json(e, "Resources", []) or []
    rec.reported_by = get_json(e, "ReportedBy", {}) or {}
    rec.listed_by = get_json(e, "ListedBy", []) or []
    rec.history = get_json(e, "History", []) or []
    rec.decision = get_json(e, "Decision", {}) or {}
    rec.approvals = [Approval.from_json(a) for a in get_json(e, "Approvals", []) or []]
    return rec


# ---- Decisions and alerts ---------------------------------------------------------------------
def decision_entity(rec: EventRecord, decision: Dict[str, Any], at: datetime) -> Dict[str, Any]:
    entity = {
        "PartitionKey": day(at),
        "RowKey": safe_key(f"{rec.event_id}_{rec.decision_seq:04d}"),
        "EventId": rec.event_id,
        "EventType": rec.event_type,
        "Seq": rec.decision_seq,
        "At": at,
        "Action": decision["action"],
        "State": decision["state"],
        "Rule": decision["rule"],
        "Reason": decision["reason"][:4000],
        "Severity": decision["severity"],
        "DecidedBy": decision["decidedBy"],
        "LeaderVmId": decision.get("leaderVmId") or "",
        "LeaderVmName": decision.get("leaderVmName") or "",
        "MessageId": decision.get("messageId") or "",
        "ExpiresAt": parse(decision.get("expiresAt")) if decision.get("expiresAt") else None,
    }
    return {k: v for k, v in entity.items() if v is not None}


def result_entity(env: Envelope, now: datetime) -> Dict[str, Any]:
    """An approval result envelope, logged in Decisions beside the decision it answers."""
    d = env.data
    entity = {
        "PartitionKey": day(env.time),
        "RowKey": safe_key(f"{d['eventId']}_result_{env.vm_id}_{env.id[-24:]}"),
        "EventId": d["eventId"],
        "Action": "result",
        "State": d["outcome"],
        "Rule": "",
        "Reason": str(d.get("reason", ""))[:4000],
        "Severity": "info",
        "DecidedBy": d.get("decidedBy") or "",
        "LeaderVmId": env.vm_id,
        "LeaderVmName": env.vm_name,
        "MessageId": d.get("messageId") or "",
        "At": _dt(d.get("at")) or env.time,
        "ReceivedAt": now,
    }
    return entity


def alert_entity(alert: Alert, delivery: Optional[Delivery], fmt: str) -> Dict[str, Any]:
    """The Alerts row. `delivery` None: the alert was claimed by an earlier instance (or this one
    before a crash), so whether it was delivered is not known here: the row gets everything but the
    delivery columns, and a merge never overwrites what the sender recorded."""
    entity = {
        "PartitionKey": day(alert.at),
        "RowKey": safe_key(alert.key),
        "Key": alert.key,
        "Kind": alert.kind,
        "Severity": alert.severity,
        "Title": alert.title[:1000],
        "Text": alert.text[:4000],
        "EventId": alert.event_id or "",
        "Status": alert.status or "",
        "At": alert.at,
        "Format": fmt,
    }
    if delivery is not None:
        entity.update({"Sent": delivery.sent, "Attempts": delivery.attempts, "Rounds": alert.rounds,
                       "Error": delivery.error[:1000], "HttpStatus": delivery.http_status})
    put_json(entity, "Facts", alert.facts)
    return {k: v for k, v in entity.items() if v is not None}


def iso_or_none(moment: Optional[datetime]) -> Optional[str]:
    return iso(moment) if moment else None
