"""Log table rows (Incarnations, Quarantine, Decisions, Alerts): the history analytics reads
(docs/central.md). Deterministic keys: a replay rewrites the same row."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Dict, Optional

from central.model.alert import Alert, Delivery
from central.model.envelope import BadEnvelope, Envelope
from central.model.times import aware, parse

from .int64 import whole
from .tables import put_json, safe_key


def day(moment: datetime) -> str:
    return aware(moment).strftime("%Y-%m-%d")


def month(moment: datetime) -> str:
    return aware(moment).strftime("%Y-%m")


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
        "Incarnation": whole(data["incarnation"]),
        "PreviousIncarnation": whole(data.get("previousIncarnation")),
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
    if bad.extra.get("trustIssuer") is not None and "authProperties" in bad.extra:
        # a trust refusal: what re-verification needs once the operator repairs trust
        entity["FailureClass"] = "trust"
        entity["TrustIssuer"] = str(bad.extra["trustIssuer"])[:512]
        entity["EnqueuedAt"] = bad.extra.get("receivedAt") or now
        put_json(entity, "AuthProperties", bad.extra["authProperties"])
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
        entity["Incarnation"] = whole(data["incarnation"])
    put_json(entity, "Errors", data.get("errors"))
    put_json(entity, "Body", data.get("raw", ""))
    return entity


# ---- Decisions and alerts ---------------------------------------------------------------------
def decision_entity(event_id: str, event_type: str, seq: int, decision: Dict[str, Any],
                    at: datetime) -> Dict[str, Any]:
    entity = {
        "PartitionKey": day(at),
        "RowKey": safe_key(f"{event_id}_{seq:04d}"),
        "EventId": event_id,
        "EventType": event_type,
        "Seq": seq,
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


def shadow_entity(event_id: str, event_type: str, seq: int, verdict: Dict[str, Any],
                  at: datetime) -> Dict[str, Any]:
    """A shadow policy's verdict: a Decisions row beside the live ones, marked Shadow (never acted on)."""
    entity = decision_entity(event_id, event_type, seq, verdict, at)
    entity["RowKey"] = safe_key(f"{event_id}_shadow_{seq:04d}")
    entity["Shadow"] = True
    return entity


def result_decider(env: Envelope, decided_by: str = "") -> str:
    """Who decided what an approval result reports. `decided_by`: central's own record of the attempt the
    result answers (a sign-in's or the policy's name), when it answers one. Otherwise only the VM's word is
    known: "vm:<name>", then what it says in brackets (a forwarder's local approval, or anything a VM
    writes): never a bare "operator:..." a VM could pass off as a signed-in person."""
    return decided_by or vm_decider(env.vm_name, env.data.get("decidedBy"))


def vm_decider(vm_name: str, claim: object) -> str:
    """"vm:<name>", and what the VM says decided, in brackets: a VM's word, recorded as one."""
    said = str(claim or "")[:200]
    return f"vm:{vm_name} ({said})" if said else f"vm:{vm_name}"


def result_entity(env: Envelope, now: datetime, decided_by: str = "") -> Dict[str, Any]:
    """An approval result envelope, logged in Decisions beside the decision it answers (`decided_by`: see
    result_decider)."""
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
        "DecidedBy": result_decider(env, decided_by),
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
                       "Error": delivery.error[:1000], "HttpStatus": delivery.http_status,
                       "GivenUp": delivery.outcome == "failed", "Outcome": delivery.outcome})
    put_json(entity, "Facts", alert.facts)
    return {k: v for k, v in entity.items() if v is not None}

