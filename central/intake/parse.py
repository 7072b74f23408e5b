"""Parse and validate one envelope body (schemas/envelope.schema.json).

A body that is not JSON or fails the schema becomes a `BadEnvelope` (kept whole, with its errors)
instead of an exception, so one bad message never stops the rest of a batch.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Any, Optional, Union

import schemas
from central.model.envelope import (  # noqa: F401  (what parse_body returns, named beside it)
    APPROVAL_RESULT,
    HEARTBEAT,
    INCARNATION,
    QUARANTINED,
    BadEnvelope,
    Envelope,
)
from central.model.times import parse

SCHEMA = "envelope.schema.json"
def _text(body: Union[bytes, str]) -> str:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body).decode("utf-8", errors="replace")
    return str(body)


MAX_BODY_BYTES = 1024 * 1024  # Event Hubs' own message limit: a bigger body did not come through a hub


def _oversized(body: Union[bytes, str]) -> Optional[BadEnvelope]:
    """A BadEnvelope for a body over MAX_BODY_BYTES (its head kept, the whole hashed), else None."""
    raw = bytes(body) if isinstance(body, (bytes, bytearray, memoryview)) else None
    size = len(raw) if raw is not None else len(body)  # characters: a lower bound of the bytes
    if size <= MAX_BODY_BYTES:
        return None
    whole = raw if raw is not None else str(body).encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(whole).hexdigest()
    head = _text(raw[:MAX_BODY_BYTES]) if raw is not None else str(body)[:MAX_BODY_BYTES]
    message = (f"body of {size} {'bytes' if raw is not None else 'characters'} is larger than the "
               f"{MAX_BODY_BYTES}-byte Event Hubs message limit; not parsed (first {MAX_BODY_BYTES} kept)")
    return BadEnvelope(head, [{"path": "/", "message": message}], digest, extra={"size": size})


@cache
def _rs_validator() -> Any:
    """The envelope schema compiled by jsonschema-rs (Rust, ~100x faster than jsonschema on a valid
    envelope), with the IMDS schema it refers to; None when the package is missing."""
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover - pinned in requirements.txt
        return None
    imds = schemas.load("imds-scheduled-events.schema.json")
    registry = jsonschema_rs.Registry([(imds["$id"], imds), ("imds-scheduled-events.schema.json", imds)])
    return jsonschema_rs.Draft202012Validator(schemas.load(SCHEMA), registry=registry, validate_formats=True)


def _fast_valid(obj: Any) -> bool:
    """Does the body pass the schema (jsonschema-rs)? A False is checked again by jsonschema, the
    reference every side uses, whose answer decides; a True is trusted: tests/fuzz compares what central
    accepts with jsonschema's verdict on hostile and mutated envelopes."""
    validator = _rs_validator()
    if validator is None:
        return bool(schemas.validator(SCHEMA).is_valid(obj))
    try:
        return bool(validator.is_valid(obj))
    except (ValueError, TypeError, OverflowError, RecursionError):  # e.g. an integer past 64 bits
        return False


def parse_body(body: Union[bytes, str]) -> Union[Envelope, BadEnvelope]:
    """One Event Hubs message body -> Envelope, or BadEnvelope with the reasons."""
    too_big = _oversized(body)
    if too_big is not None:
        return too_big
    text = _text(body)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return BadEnvelope(text, [{"path": "/", "message": f"not JSON: {exc}"[:300]}], digest)
    except RecursionError:  # '[' * 1000: json.loads gives up by recursing too deep
        return BadEnvelope(text, [{"path": "/", "message": "not JSON: nested too deep to parse"}], digest)
    if not _fast_valid(obj):  # the fast path; the full error list only for the rare bad one
        try:
            errs = schemas.errors(SCHEMA, obj)
        except RecursionError:  # the error message's repr of a deeply nested value
            errs = [{"path": "/", "message": "fails the envelope schema; nested too deep to explain"}]
        if errs:  # (none: the fast validator was stricter than the reference, which decides)
            fields = obj if isinstance(obj, dict) else {}
            vm_id = fields.get("partitionkey") if isinstance(fields.get("partitionkey"), str) else None
            env_id = fields.get("id") if isinstance(fields.get("id"), str) else None
            return BadEnvelope(text, errs, digest, vm_id=vm_id, envelope_id=env_id)
    data = obj["data"]
    time = parse(obj["time"])
    if time is None:
        return BadEnvelope(text, [{"path": "/time", "message": "unreadable date-time"}], digest)
    vm = data.get("vm") or {}
    vm_id = vm.get("vmId") or obj["partitionkey"]
    if obj["partitionkey"] != vm_id:
        return BadEnvelope(
            text,
            [
                {
                    "path": "/partitionkey",
                    "message": f"partitionkey {obj['partitionkey']!r} is not data.vm.vmId {vm_id!r}",
                }
            ],
            digest,
            vm_id=vm_id,
            envelope_id=obj["id"],
        )
    return Envelope(
        id=obj["id"],
        type=obj["type"],
        vm_id=vm_id,
        vm_name=vm.get("name") or obj["subject"],
        time=time,
        data=data,
        raw=obj,
    )
