"""Each poll: GET the document; publish a new incarnation (with its diff) or quarantine a bad body.

- Unparsable JSON or a schema-invalid document -> a quarantined envelope with the errors (never
  dropped), deduplicated by body hash so the same bad body is not quarantined every second.
- A new DocumentIncarnation (higher, or LOWER = an IMDS reset, flagged `reset: true`; or the same
  number with different content, also a reset) -> diff against the last published document, one
  incarnation envelope, written with the new state in one outbox transaction.
- The same incarnation and content -> nothing.
- Unchanged bodies are not parsed at all: the GET carries If-None-Match with the last ETag (IMDS may
  answer 304, as Microsoft's samples expect), and a 200 whose body is byte-for-byte the last one is
  skipped too (IMDS does not promise ETags). Nothing is skipped that could hide a change: a reset
  (a lower DocumentIncarnation) changes the body, so it is parsed and compared as before.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from . import envelope, logs, validation
from .clock import iso
from .diff import diff
from .envelope import canonical, sha256
from .identity import VmIdentity, from_compute
from .imds import ImdsClient
from .outbox import Outbox

log = logs.get("poller")
IMDS_SCHEMA = "imds-scheduled-events.schema.json"

# Outbox state keys (the last published state survives restarts with the outbox).
LAST_INCARNATION = "last_incarnation"
LAST_DOCUMENT = "last_document"
LAST_QUARANTINE = "last_quarantine_sha256"


@dataclass
class PollResult:
    outcome: str  # "published" | "unchanged" | "quarantined" | "quarantine-repeat"
    incarnation: Optional[int] = None
    envelope_id: Optional[str] = None
    errors: Optional[List[Dict[str, str]]] = None


@dataclass
class Parsed:
    document: Any
    incarnation: Optional[int]
    errors: List[Dict[str, str]]


MAX_DEPTH = 32  # a real document nests 4 levels; deeper is hostile (and would exhaust the stack)


def _depth_over(obj: Any, limit: int) -> bool:
    """True if `obj` nests deeper than `limit` (iterative: no recursion on hostile input)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (RFC 8259)")


def _finite(literal: str) -> float:
    value = float(literal)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"number {literal[:40]} is out of range")
    return value


def _load(text: str) -> Any:
    """json.loads, strict and bounded: raises ValueError (never RecursionError) on nesting too deep,
    on NaN/Infinity and on numbers that overflow a float (the envelope must stay strict JSON)."""
    try:
        document = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    if _depth_over(document, MAX_DEPTH):
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    try:  # an escaped lone surrogate ("\ud800") parses, but no UTF-8 outbox, file or hub can hold it
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)") from None
    return document


def parse(text: str) -> Parsed:
    """Parse and validate a scheduled-events body. `errors` empty means a valid document."""
    try:
        document = _load(text)
    except ValueError as exc:
        return Parsed(None, None, [{"path": "/", "message": f"not JSON: {exc}"[:300]}])
    errors = validation.errors(IMDS_SCHEMA, document)  # ValidationUnavailable: handled again next poll
    number: Optional[int] = None
    if isinstance(document, dict):
        raw = document.get("DocumentIncarnation")
        if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
            number = raw
        elif isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 18:  # ("²".isdigit())
            number = int(raw)
    return Parsed(document, number, errors)


def scheduled_for(document: Optional[Dict[str, Any]], vm_name: str) -> List[str]:
    """EventIds Scheduled (not yet Started) whose Resources include this VM."""
    ids = []
    for event in (document or {}).get("Events") or []:
        if isinstance(event, dict) and event.get("EventStatus") == "Scheduled" \
                and vm_name in (event.get("Resources") or []):
            ids.append(str(event.get("EventId")))
    return ids


class Poller:
    """Owns the VM identity and the last published document. `subscribers` are called with each
    valid document polled (e.g. the approval reader), after it is safely in the outbox."""

    def __init__(self, client: ImdsClient, outbox: Outbox, identity_ttl: float = 600.0,
                 on_put: Optional[Callable[[], None]] = None) -> None:
        self.client = client
        self.outbox = outbox
        self.identity_ttl = identity_ttl
        self.on_put = on_put
        self.identity: Optional[VmIdentity] = None
        self._identity_at = 0.0
        self.last_incarnation: Optional[int] = outbox.get_state(LAST_INCARNATION)
        self.last_document: Optional[Dict[str, Any]] = outbox.get_state(LAST_DOCUMENT)
        self.current_document: Optional[Dict[str, Any]] = self.last_document
        self.subscribers: List[Callable[[Dict[str, Any]], None]] = []
        self._lock = threading.Lock()
        # The last body fully handled (published or found unchanged, subscribers told) and its ETag.
        self._etag: Optional[str] = None
        self._last_text: Optional[str] = None
        self._subscriber_failed = False
        self.stats = {"polls": 0, "notModified": 0, "sameBody": 0, "parsed": 0}

    # ---- identity -----------------------------------------------------------------------------

    def ensure_identity(self) -> VmIdentity:
        """Fetch the identity once, refresh it every `identity_ttl` s (tags change); keep the old
        one if a refresh fails."""
        now = time.monotonic()
        if self.identity is None or now - self._identity_at > self.identity_ttl:
            try:
                identity = from_compute(self.client.get_compute())
            except Exception:
                if self.identity is None:
                    raise
                log.warning("identity refresh failed; keeping the previous one", exc_info=True)
                self._identity_at = now
                return self.identity
            if identity != self.identity:
                log.info("vm identity", extra=logs.fields(vm=identity.as_vm()))
            self.identity, self._identity_at = identity, now
        return self.identity

    # ---- one poll -----------------------------------------------------------------------------

    def poll_once(self) -> PollResult:
        """GET, compare, put. Raises the client's ImdsError when IMDS does not answer."""
        vm = self.ensure_identity()
        if self._etag:
            response = self.client.get_scheduled_events(etag=self._etag)
        else:  # nothing to compare with yet (or IMDS sends no ETag): a plain GET
            response = self.client.get_scheduled_events()
        self.stats["polls"] += 1
        if response.status == 304:
            self.stats["notModified"] += 1
            return PollResult("unchanged", self.last_incarnation)
        text = response.text
        if text == self._last_text:
            self.stats["sameBody"] += 1
            self._etag = response.headers.get("ETag") or None
            return PollResult("unchanged", self.last_incarnation)
        self.stats["parsed"] += 1
        self._subscriber_failed = False
        result = self._handle(vm, text, iso())
        # Remembered only once fully handled: an outbox failure above raises and a subscriber failure
        # is logged; either way the same body is handled again at the next poll.
        if not self._subscriber_failed:
            self._last_text, self._etag = text, response.headers.get("ETag") or None
        return result

    def _handle(self, vm: VmIdentity, text: str, observed_at: str) -> PollResult:
        parsed = parse(text)
        if parsed.errors:
            return self._quarantine(vm, text, parsed, observed_at)
        document: Dict[str, Any] = parsed.document
        number = parsed.incarnation
        if number is None:  # the schema rules this out; never trust that blindly
            parsed.errors = [{"path": "/DocumentIncarnation", "message": "not a non-negative integer"}]
            return self._quarantine(vm, text, parsed, observed_at)
        result = self._publish(vm, number, document, observed_at)
        self.current_document = document
        for subscriber in list(self.subscribers):
            try:
                subscriber(document)
            except Exception:  # a subscriber bug must not stop polling
                self._subscriber_failed = True
                log.exception("document subscriber failed")
        return result

    def _publish(self, vm: VmIdentity, number: int, document: Dict[str, Any], observed_at: str) -> PollResult:
        previous, before = self.last_incarnation, self.last_document
        if previous == number and before is not None and canonical(before) == canonical(document):
            return PollResult("unchanged", number)
        reset = previous is not None and number <= previous
        change = diff(before, document)
        env = envelope.incarnation(vm, number, previous, reset, self.client.api_version, document,
                                   change, observed_at)
        self.outbox.put(env, state={LAST_INCARNATION: number, LAST_DOCUMENT: document, LAST_QUARANTINE: None})
        self.last_incarnation, self.last_document = number, document
        log.info("incarnation", extra=logs.fields(
            incarnation=number, previous=previous, reset=reset, id=env["id"],
            new=[e.get("EventId") for e in change.new], gone=[e.get("EventId") for e in change.gone],
            changed=[c["after"].get("EventId") for c in change.changed]))
        if self.on_put:
            self.on_put()
        return PollResult("published", number, env["id"])

    def _quarantine(self, vm: VmIdentity, raw: str, parsed: Parsed, observed_at: str) -> PollResult:
        digest = sha256(raw)
        if self.outbox.get_state(LAST_QUARANTINE) == digest:
            return PollResult("quarantine-repeat", parsed.incarnation, errors=parsed.errors)
        env = envelope.quarantined(vm, self.client.api_version, raw, parsed.errors, parsed.document,
                                   parsed.incarnation, observed_at)
        self.outbox.put(env, state={LAST_QUARANTINE: digest})
        log.warning("quarantined an invalid document", extra=logs.fields(
            id=env["id"], errors=parsed.errors[:5], rawSha256=digest))
        if self.on_put:
            self.on_put()
        return PollResult("quarantined", parsed.incarnation, env["id"], parsed.errors)

    def scheduled_event_ids(self) -> List[str]:
        if self.identity is None:
            return []
        return scheduled_for(self.current_document, self.identity.name)
