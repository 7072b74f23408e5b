"""The `quarantined` note that stands in for an envelope no Event Hubs event can hold: it cannot be sent
ever, so it must not block the outbox (forwarder.sinks.eventhub sends the note instead)."""

from __future__ import annotations

import json
from typing import Any, Dict

from ..clock import iso
from ..envelope import QUARANTINED, EnvelopeInvalid, sha256, validate
from .base import SinkError

NOTE_OVERHEAD = 16 * 1024


def body_bytes(env: Dict[str, Any]) -> bytes:
    """An envelope as it goes on the wire: compact JSON, UTF-8."""
    return json.dumps(env, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def oversize_note(env: Dict[str, Any], limit: int) -> Dict[str, Any]:
    """A `quarantined` envelope standing in for `env`, which no batch of `limit` bytes can hold.

    Its id is `<original id>:oversize` (trimmed to the schema's 512), so a resend of the note is
    recognisable downstream; `raw` keeps the start of the original JSON, `rawSha256` all of it.
    """
    body = body_bytes(env).decode("utf-8")
    data = env.get("data") if isinstance(env.get("data"), dict) else {}
    vm = data.get("vm")
    if not isinstance(vm, dict):
        vm = {"vmId": env.get("partitionkey") or "unknown", "name": env.get("subject") or "unknown"}
    keep = max(1024, min(256 * 1024, limit // 2 - NOTE_OVERHEAD))
    original_id = str(env.get("id", ""))
    note = {
        "specversion": "1.0",
        "id": (original_id[:500] + ":oversize"),
        "source": env.get("source") or f"vm://{vm.get('vmId')}",
        "type": QUARANTINED,
        "subject": env.get("subject") or vm.get("name") or "unknown",
        "time": iso(),
        "datacontenttype": "application/json",
        "partitionkey": env.get("partitionkey") or vm.get("vmId"),
        "data": {
            "vm": vm,
            "apiVersion": str(data.get("apiVersion", "")),
            "raw": body[:keep],
            "rawTruncated": len(body) > keep,
            "rawSha256": sha256(body),
            "document": None,
            "incarnation": data.get("incarnation") if isinstance(data.get("incarnation"), int) else None,
            "errors": [{"path": "/", "message": (
                f"envelope {original_id} of type {env.get('type')} is {len(body.encode('utf-8'))} bytes, "
                f"more than the {limit} bytes Event Hubs accepts in one event; not published, replaced "
                "by this note")}],
            "observedAt": str(data.get("observedAt") or env.get("time") or iso()),
        },
    }
    try:
        return validate(note)
    except EnvelopeInvalid as exc:
        raise SinkError(f"cannot build an oversize note for {original_id!r}: {exc}", retryable=False) from exc
