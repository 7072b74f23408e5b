"""The live IMDS check before any approval POST: re-fetch the document, never trust a cached one.

An approval is allowed only if, right now, the event is listed, still `Scheduled`, and this VM's
name (IMDS compute.name) is in its `Resources`.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Protocol

from .. import validation
from ..imds import ImdsUnavailable
from .message import Rejected

DOCUMENT_SCHEMA = "imds-scheduled-events.schema.json"


class ImdsLike(Protocol):
    def get_scheduled_events(self) -> Any: ...  # an ImdsResponse (`.text`)
    def start_events(self, event_ids: Any) -> Any: ...


def parse_document(text: str) -> Dict[str, Any]:
    """The IMDS body -> the document; Rejected if it is not a valid one (never approve on a bad read)."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise Rejected(f"imds: the scheduled-events document is not JSON ({str(exc)[:100]})") from exc
    except RecursionError:
        raise Rejected("imds: the scheduled-events document is nested too deep to read") from None
    try:
        problems = validation.errors(DOCUMENT_SCHEMA, document, limit=3)
    except validation.ValidationUnavailable as exc:  # as unreadable: nothing decided, retried later
        raise ImdsUnavailable(f"imds: the scheduled-events document could not be checked ({exc})") from exc
    except RecursionError:  # the schema error's repr of a deeply nested value
        raise Rejected("imds: the scheduled-events document is nested too deep to check") from None
    if problems:
        raise Rejected(
            "imds: the scheduled-events document fails its schema: "
            + "; ".join(f"{p['path']}: {p['message']}" for p in problems)
        )
    return document


def events_of(document: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [e for e in document.get("Events") or [] if isinstance(e, dict)]


def involves(event: Dict[str, Any], vm_name: str) -> bool:
    return vm_name in (event.get("Resources") or [])


def has_scheduled(document: Dict[str, Any], vm_name: str) -> bool:
    """True while the document lists a Scheduled event with this VM in its Resources: the only time an
    approval can apply, so the only time the approval queue is read."""
    return any(e.get("EventStatus") == "Scheduled" and involves(e, vm_name) for e in events_of(document))


def check_event(document: Dict[str, Any], event_id: str, vm_name: str) -> Dict[str, Any]:
    """The event as IMDS lists it now, or Rejected with why it must not be approved."""
    for event in events_of(document):
        # an EventId is a GUID: central may spell it in the other case (the platform feed's, Event Grid's)
        if str(event.get("EventId")).lower() == event_id.lower():
            if not involves(event, vm_name):
                raise Rejected(
                    f"foreign: this VM ({vm_name}) is not in the event's Resources "
                    f"{event.get('Resources')}"
                )
            status = event.get("EventStatus")
            if status != "Scheduled":
                raise Rejected(f"not-scheduled: event {event_id} is {status}, not Scheduled")
            return event
    raise Rejected(
        f"unknown-event: IMDS does not list event {event_id} now (done, cancelled or never existed)"
    )


def live_event(imds: ImdsLike, event_id: str, vm_name: str) -> Dict[str, Any]:
    """GET the document now and check the event (see check_event)."""
    return check_event(parse_document(imds.get_scheduled_events().text), event_id, vm_name)
