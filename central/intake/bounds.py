"""What one envelope may carry before central stages anything (issue 14, property 0).

Checked after the schema, before any state changes: a body failing here is quarantined (kept whole,
alerted) and the rest of the batch goes on. The bounds keep each sender's cost bounded (events per
document, Resources per event) and every value storable in Azure Tables (key characters and lengths,
Edm.DateTime range, Int64 width, no lone surrogates that UTF-8 cannot carry).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

from central.model.times import parse

NEW_EVENTS_PER_HOUR = 32  # events one VM may bring to central's notice per hour (IMDS shows a handful a week)
MAX_EVENTS_PER_DOCUMENT = 32  # IMDS lists a handful; 32 keeps one envelope inside one transaction
MAX_RESOURCES_PER_EVENT = 1000  # a scale set's placement group at most
MAX_NAME_CHARS = 128  # a VM name (Linux 64, Windows 15), with margin
MAX_KEY_CHARS = 256  # EventId / vmId as part of a RowKey (Tables: 1 KiB)
INT64 = 2**63
# Characters Azure Tables forbids in PartitionKey/RowKey: / \ # ? and control characters.
_BAD_KEY = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def key_problem(value: Any, what: str) -> str:
    """Why `value` cannot be (part of) a Table key, or ''."""
    if not isinstance(value, str) or not value:
        return f"{what} is empty or not text"
    if len(value) > MAX_KEY_CHARS:
        return f"{what} is longer than {MAX_KEY_CHARS} characters"
    if _BAD_KEY.search(value):
        return (f"{what} {value[:60]!r} holds a character Azure Tables keys forbid "
                "(/ \\ # ? or a control character)")
    if _has_surrogate(value):
        return f"{what} holds a lone surrogate (not UTF-8)"
    return ""


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def text_problem(raw_text: str, obj: Any) -> str:
    """A JSON text whose strings hold lone surrogates (\\ud800) decodes fine but cannot be sent to
    Storage as UTF-8: found by a cheap scan first, confirmed on the parsed object only then."""
    if "\\u" not in raw_text or not _SURROGATE_ESCAPE.search(raw_text):
        return ""
    import json

    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "a string holds a lone UTF-16 surrogate: it cannot be stored"
    return ""


def int_problem(value: Any, what: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return f"{what} {value} does not fit a 64-bit integer"
    return ""


def envelope_problems(kind: str, data: Dict[str, Any]) -> List[Dict[str, str]]:
    """Every reason this schema-valid envelope's data cannot be applied and stored ([] = fine)."""
    errs: List[Dict[str, str]] = []

    def add(path: str, message: str) -> None:
        if message:
            errs.append({"path": path, "message": message})

    vm = data.get("vm") or {}
    add("/data/vm/vmId", key_problem(vm.get("vmId"), "vmId"))
    if isinstance(vm.get("name"), str) and len(vm["name"]) > MAX_NAME_CHARS:
        add("/data/vm/name", f"VM name longer than {MAX_NAME_CHARS} characters")
    add("/data/incarnation", int_problem(data.get("incarnation"), "incarnation"))
    outbox = data.get("outbox") or {}
    for field in ("dropped", "backlog"):
        add(f"/data/outbox/{field}", int_problem(outbox.get(field), f"outbox.{field}"))
    if data.get("observedAt") and parse(data["observedAt"]) is None:
        add("/data/observedAt", "date-time outside what Table storage holds (1601..9999 UTC)")
    if kind.endswith("approvalresult.v1"):
        add("/data/eventId", key_problem(data.get("eventId"), "eventId"))
    events = ((data.get("document") or {}).get("Events") or []) if kind.endswith("incarnation.v1") else []
    if len(events) > MAX_EVENTS_PER_DOCUMENT:
        add(
            "/data/document/Events",
            f"{len(events)} events in one document; central takes at most {MAX_EVENTS_PER_DOCUMENT}",
        )
        return errs
    seen = set()
    for i, event in enumerate(events):
        path = f"/data/document/Events/{i}"
        add(f"{path}/EventId", key_problem(event.get("EventId"), "EventId"))
        if event.get("EventId") in seen:
            add(f"{path}/EventId", "the same EventId twice in one document")
        seen.add(event.get("EventId"))
        add(f"{path}/DurationInSeconds", int_problem(event.get("DurationInSeconds"), "DurationInSeconds"))
        if event.get("NotBefore") and parse(event["NotBefore"]) is None:
            add(
                f"{path}/NotBefore",
                f"NotBefore {str(event['NotBefore'])[:40]!r} is unreadable or outside "
                "what Table storage holds",
            )
        resources = event.get("Resources") or []
        if len(resources) > MAX_RESOURCES_PER_EVENT:
            add(
                f"{path}/Resources",
                f"{len(resources)} Resources; central takes at most {MAX_RESOURCES_PER_EVENT}",
            )
        elif any(not isinstance(r, str) or len(r) > MAX_NAME_CHARS for r in resources):
            add(f"{path}/Resources", f"a Resources name longer than {MAX_NAME_CHARS} characters")
    return errs
