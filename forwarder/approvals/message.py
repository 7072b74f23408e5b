"""One approval message checked on its own: decoding, schema, expiry, addressed to this VM.

The message body is the JSON of schemas/approval.schema.json, either as plain text or base64
(the Functions queue binding's default). Nothing here trusts the sender: the live IMDS check
(`gate`) comes after, right before any POST.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Dict, Optional

from .. import validation

SCHEMA = "approval.schema.json"
MAX_BODY = 64 * 1024  # a queue message is at most 64 KiB; anything bigger is not ours


class Rejected(Exception):
    """The message must not be acted on. `reason` starts with a short keyword (malformed, forged, ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Approval:
    message_id: str
    event_id: str
    vm_id: str
    vm_name: str
    action: str
    decided_by: str
    reason: str
    issued_at: datetime
    expires_at: datetime
    incarnation: Optional[int]
    raw: Dict[str, Any]


def parse_time(value: str) -> datetime:
    """RFC 3339 (the schema's date-time) -> aware UTC datetime."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text) if "." not in text else _with_fraction(text)
    if moment.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return moment.astimezone(timezone.utc)


def _with_fraction(text: str) -> datetime:
    # Python 3.9's fromisoformat accepts only 3 or 6 fraction digits: normalise to 6.
    head, _, rest = text.partition(".")
    digits = ""
    while rest and rest[0].isdigit():
        digits, rest = digits + rest[0], rest[1:]
    return datetime.fromisoformat(f"{head}.{(digits + '000000')[:6]}{rest}")


def decode(body: Any) -> Dict[str, Any]:
    """Queue message content -> the JSON object (plain JSON or base64 of it). Raises Rejected."""
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Rejected("malformed: message is not UTF-8 text") from exc
    if not isinstance(body, str) or not body.strip():
        raise Rejected("malformed: empty message")
    if len(body) > MAX_BODY * 2:
        raise Rejected(f"malformed: message of {len(body)} characters is larger than any approval")
    text = body.strip()
    if not text.startswith("{"):
        try:
            text = base64.b64decode(text, validate=True).decode("utf-8").strip()
        except (binascii.Error, ValueError) as exc:
            raise Rejected("malformed: neither JSON nor base64-encoded JSON") from exc
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise Rejected(f"malformed: not JSON ({str(exc)[:120]})") from exc
    except RecursionError:  # '[' * 1000 fits in 64 KiB; json.loads gives up by recursing too deep
        raise Rejected("malformed: JSON nested too deep for an approval") from None
    if not isinstance(obj, dict):
        raise Rejected("malformed: JSON is not an object")
    try:  # an escaped lone surrogate ("\ud800") parses, but its result could never reach the outbox
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise Rejected("malformed: a string holds an unpaired UTF-16 surrogate escape") from None
    return obj


def validate(obj: Dict[str, Any]) -> Approval:
    """Schema check (approval.schema.json) -> Approval. Raises Rejected("forged: ...")."""
    problems = validation.errors(SCHEMA, obj, limit=5)  # ValidationUnavailable: the message waits
    if problems:
        detail = "; ".join(f"{p['path']}: {p['message']}" for p in problems)
        raise Rejected(f"forged: fails {SCHEMA}: {detail}"[:1000])
    try:
        issued, expires = parse_time(obj["issuedAt"]), parse_time(obj["expiresAt"])
    except ValueError as exc:
        raise Rejected(f"forged: bad timestamp ({exc})") from exc
    return Approval(
        message_id=obj["messageId"].lower(),
        event_id=obj["eventId"],
        vm_id=obj["vmId"],
        vm_name=obj["vmName"],
        action=obj["action"],
        decided_by=obj["decidedBy"],
        reason=obj.get("reason", ""),
        issued_at=issued,
        expires_at=expires,
        incarnation=obj.get("incarnation"),
        raw=obj,
    )


def check_addressed(approval: Approval, vm_id: str, vm_name: str) -> None:
    """The message must name this VM (it was elected leader, or the event is its own)."""
    if approval.vm_id.lower() != vm_id.lower():
        raise Rejected(f"foreign: addressed to vmId {approval.vm_id}, this VM is {vm_id}")
    if approval.vm_name != vm_name:
        raise Rejected(f"foreign: addressed to VM name {approval.vm_name!r}, this VM is {vm_name!r}")


def check_fresh(approval: Approval, now: datetime, max_skew_seconds: float = 300.0) -> None:
    """Not expired, and not issued implausibly far in the future (clock skew tolerated)."""
    if now >= approval.expires_at:
        raise Rejected(f"stale: expired at {approval.expires_at.isoformat()} (now {now.isoformat()})")
    if approval.expires_at <= approval.issued_at:
        raise Rejected("forged: expiresAt is not after issuedAt")
    if (approval.issued_at - now).total_seconds() > max_skew_seconds:
        raise Rejected(f"forged: issuedAt {approval.issued_at.isoformat()} is in the future")
