"""Build the CloudEvents 1.0 envelopes of schemas/envelope.schema.json (checked against it but in the daemon).

`id` is stable per VM and content, so a resend (after a crash, a sink retry) carries the same id
and central can dedupe, while a reset that reuses an incarnation number with new content gets a
new id: `<vmId>:incarnation:<n>:<sha256(canonical document)[:16]>`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

from .clock import iso
from .diff import Diff
from .identity import VmIdentity
from .validation import checks_own_output
from .validation import errors as schema_errors

SCHEMA = "envelope.schema.json"
INCARNATION = "scheduledevents.incarnation.v1"
HEARTBEAT = "scheduledevents.heartbeat.v1"
QUARANTINED = "scheduledevents.quarantined.v1"
APPROVAL_RESULT = "scheduledevents.approvalresult.v1"
RAW_LIMIT = 256 * 1024


class EnvelopeInvalid(ValueError):
    """An envelope this forwarder built fails the schema: a bug in the forwarder, never published."""

    def __init__(self, errors: List[Dict[str, str]], envelope: Dict[str, Any]) -> None:
        super().__init__("forwarder built a schema-invalid envelope (a bug; not published): "
                         + "; ".join(f"{e['path']}: {e['message']}" for e in errors[:5]))
        self.errors = errors
        self.envelope = envelope


def canonical(obj: Any) -> str:
    """Deterministic JSON text (sorted keys, no spaces) for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def validate(envelope: Dict[str, Any]) -> Dict[str, Any]:
    """Return `envelope` if it matches the schema, else raise EnvelopeInvalid. Not checked in the daemon
    (forwarder.validation says why): central checks every envelope it receives."""
    if not checks_own_output():
        return envelope
    errors = schema_errors(SCHEMA, envelope)
    if errors:
        raise EnvelopeInvalid(errors, envelope)
    return envelope


def build(vm: VmIdentity, type_: str, id_: str, data: Dict[str, Any],
          time: Optional[str] = None) -> Dict[str, Any]:
    """The CloudEvents wrapper around `data` (validated). Other envelope types use this too."""
    return validate({
        "specversion": "1.0",
        "id": id_[:512],
        "source": vm.source,
        "type": type_,
        "subject": vm.name,
        "time": time or iso(),
        "datacontenttype": "application/json",
        "partitionkey": vm.vm_id,
        "data": data,
    })


def hub_partition_key(envelope: Dict[str, Any]) -> str:
    """The Event Hubs partition key: the VM's scale set (lower-cased, as central's budgets group it) when it
    is in one, else its vmId (the envelope's `partitionkey`). One VM's envelopes stay in one partition, in
    order, and one scale set's reach one central instance: the instance deciding a scale-set budget group
    then reads little of what the others change (central.policy.group_tags). A scale set holds at most
    1,000 VMs, ~17 heartbeats a second at the default interval: far under one partition's limits."""
    data = envelope.get("data")
    vm = data.get("vm") if isinstance(data, dict) else None
    scale_set = vm.get("vmScaleSetName") if isinstance(vm, dict) else None
    if isinstance(scale_set, str) and scale_set:
        return f"scaleset:{scale_set.lower()}"
    return str(envelope.get("partitionkey") or (vm or {}).get("vmId") or "")


def incarnation_id(vm_id: str, incarnation: int, document: Dict[str, Any]) -> str:
    return f"{vm_id}:incarnation:{incarnation}:{sha256(canonical(document))[:16]}"


def incarnation(vm: VmIdentity, number: int, previous: Optional[int], reset: bool, api_version: str,
                document: Dict[str, Any], change: Diff, observed_at: str) -> Dict[str, Any]:
    data = {
        "vm": vm.as_vm(),
        "incarnation": number,
        "previousIncarnation": previous,
        "reset": reset,
        "apiVersion": api_version,
        "document": document,
        "diff": change.as_dict(),
        "observedAt": observed_at,
    }
    return build(vm, INCARNATION, incarnation_id(vm.vm_id, number, document), data, time=observed_at)


def quarantined(vm: VmIdentity, api_version: str, raw: str, errors: List[Dict[str, str]],
                document: Any, number: Optional[int], observed_at: str) -> Dict[str, Any]:
    """A document that failed to parse or validate, forwarded verbatim with its errors."""
    digest = sha256(raw)
    data: Dict[str, Any] = {
        "vm": vm.as_vm(),
        "apiVersion": api_version,
        "raw": raw[:RAW_LIMIT],
        "rawTruncated": len(raw) > RAW_LIMIT,
        "rawSha256": digest,
        # A body over RAW_LIMIT is carried by its head and hash only: the parsed copy would be as big
        # again and push the envelope past Event Hubs' 1 MB message limit.
        "document": document if len(raw) <= RAW_LIMIT else None,
        "incarnation": number,
        "errors": errors or [{"path": "/", "message": "invalid"}],
        "observedAt": observed_at,
    }
    return build(vm, QUARANTINED, f"{vm.vm_id}:quarantined:{digest[:16]}", data, time=observed_at)


def heartbeat(vm: VmIdentity, version: str, started_at: str, last_incarnation: Optional[int],
              scheduled_event_ids: List[str], outbox: Dict[str, Any], imds: Dict[str, Any],
              now: Optional[str] = None) -> Dict[str, Any]:
    at = now or iso()
    data = {
        "vm": vm.as_vm(),
        "forwarder": {"version": version, "startedAt": started_at},
        "lastIncarnation": last_incarnation,
        "scheduledEventIds": scheduled_event_ids,
        "outbox": outbox,
        "imds": imds,
    }
    return build(vm, HEARTBEAT, f"{vm.vm_id}:heartbeat:{at}", data, time=at)


def approval_result(vm: VmIdentity, data: Dict[str, Any]) -> Dict[str, Any]:
    """An approval result (forwarder/approvals). `data` from ApprovalResult.data(vm.as_vm()). The id
    hashes the decision (event, message, outcome, decider, reason), not the time: a re-report after a
    crash carries the same id."""
    key = {k: data.get(k) for k in ("eventId", "messageId", "outcome", "decidedBy", "reason")}
    id_ = f"{vm.vm_id}:approvalresult:{data.get('eventId') or '-'}:{sha256(canonical(key))[:16]}"
    return build(vm, APPROVAL_RESULT, id_, data, time=data.get("at"))
