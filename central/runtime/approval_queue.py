"""Approval messages to per-VM Storage queues (azure-storage-queue).

Queue name rule (the forwarder must derive the same): "vm-" + the vmId lowercased, with every
character outside [a-z0-9] turned into "-", runs of "-" collapsed and "-" trimmed from the ends;
when that is empty or longer than 60 characters: "vm-" + the first 40 hex digits of sha256(vmId).
A VM id is a GUID, so in practice: vm-2f0c8a1e-....  (Storage: 3-63 chars, lowercase letters,
digits, single hyphens, starting with a letter or digit.)

Messages are JSON text (no base64), validated against schemas/approval.schema.json before sending.
They expire no later than the event's NotBefore: the queue message's time-to-live is the seconds
until expiresAt, so an expired approval is never delivered at all.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Set

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueServiceClient

import schemas
from central.model.times import iso

SCHEMA = "approval.schema.json"


class ApprovalInvalid(ValueError):
    """A message central built fails schemas/approval.schema.json: a bug, never sent."""


def queue_name(vm_id: str) -> str:
    """The approval queue of one VM (see the module docstring for the rule)."""
    body = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9]", "-", vm_id.lower())).strip("-")
    if not body or len(body) > 60:
        body = hashlib.sha256(vm_id.encode("utf-8")).hexdigest()[:40]
    return f"vm-{body}"


def build_message(
    event_id: str,
    vm_id: str,
    vm_name: str,
    action: str,
    decided_by: str,
    reason: str,
    incarnation: int,
    issued: datetime,
    expires: datetime,
) -> Dict[str, Any]:
    """The approval message, validated (ApprovalInvalid if it does not match the schema)."""
    msg: Dict[str, Any] = {
        "schemaVersion": 1,
        "messageId": str(uuid.uuid4()),
        "eventId": event_id,
        "vmId": vm_id,
        "vmName": vm_name,
        "action": action,
        "decidedBy": decided_by[:256],
        "reason": reason[:1024],
        "issuedAt": iso(issued),
        "expiresAt": iso(expires),
    }
    if incarnation >= 0:
        msg["incarnation"] = incarnation
    errs = schemas.errors(SCHEMA, msg)
    if errs:
        raise ApprovalInvalid(
            "approval message fails the schema: " + "; ".join(f"{e['path']}: {e['message']}" for e in errs)
        )
    return msg


@dataclass
class ApprovalSender:
    service: QueueServiceClient
    _created: Set[str] = field(default_factory=set)

    def send(self, message: Dict[str, Any], now: datetime, expires: datetime) -> str:
        """Put `message` on its VM's queue (creating the queue when missing). Returns the queue name."""
        name = queue_name(message["vmId"])
        ttl = max(1, int((expires - now).total_seconds()))
        client = self.service.get_queue_client(name)
        text = json.dumps(message, separators=(",", ":"))
        try:
            # visible at once: the forwarder should act as soon as it polls
            client.send_message(text, time_to_live=ttl, visibility_timeout=0)
        except ResourceNotFoundError:
            try:
                client.create_queue()
            except ResourceExistsError:
                pass
            client.send_message(text, time_to_live=ttl, visibility_timeout=0)
        self._created.add(name)
        return name
