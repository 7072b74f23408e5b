"""IMDS documents (valid, near-valid, hostile) through the forwarder's own parse -> validate ->
envelope code, the functions `Poller.poll_once` calls. Every body must end as either a schema-valid
incarnation envelope or a schema-valid quarantined envelope with at least one explained error, never
an exception, with the quarantined raw text bounded; and the published document is strict JSON that
the outbox (SQLite, UTF-8) can store.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

import schemas
from forwarder import envelope, poller
from forwarder.diff import diff
from forwarder.imds import ImdsResponse
from forwarder.outbox import Outbox

from . import strategies as S
from .counting import SLOW_FACTOR, count, fuzz

IMDS = "imds-scheduled-events.schema.json"
ENVELOPE = "envelope.schema.json"
OBSERVED = "2026-11-21T05:00:00.000Z"
VM = S._vm()
PREVIOUS = {"DocumentIncarnation": 1, "Events": [{
    "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123", "EventStatus": "Scheduled", "EventType": "Freeze",
    "ResourceType": "VirtualMachine", "Resources": ["vm0"], "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT"}]}


def forward(text: str, previous: Optional[Dict[str, Any]] = PREVIOUS) -> Dict[str, Any]:
    """What Poller.poll_once does with one body, minus the I/O (the poller test below does that)."""
    parsed = poller.parse(text)
    if not parsed.errors and parsed.incarnation is None:  # as poll_once: e.g. 1.0 passes the schema
        parsed.errors = [{"path": "/DocumentIncarnation", "message": "not a non-negative integer"}]
    if parsed.errors:
        return envelope.quarantined(VM, "2020-07-01", text, parsed.errors, parsed.document,
                                    parsed.incarnation, OBSERVED)
    before = previous.get("DocumentIncarnation") if previous else None
    return envelope.incarnation(VM, parsed.incarnation, before, False, "2020-07-01", parsed.document,
                                diff(previous, parsed.document), OBSERVED)


def oracle_valid(text: str) -> bool:
    """Independent of the forwarder: strict JSON (no NaN/Infinity, valid Unicode) and the schema."""
    def no_constants(name: str) -> Any:
        raise ValueError(name)
    try:
        document = json.loads(text, parse_constant=no_constants)
        json.dumps(document, ensure_ascii=False).encode("utf-8")  # lone surrogates fail here
    except (ValueError, RecursionError, UnicodeEncodeError):
        return False
    if depth(document) > 32:  # the forwarder's bound: a real document nests 4 levels
        return False
    if schemas.errors(IMDS, document):
        return False
    number = document["DocumentIncarnation"]  # the forwarder's rule: an integer or a digit string
    return (isinstance(number, int) and not isinstance(number, bool)) or isinstance(number, str)


def depth(obj: Any) -> int:
    """Nesting depth, iteratively (hostile input must not exhaust the oracle's stack either)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def check(name: str, text: str) -> Dict[str, Any]:
    env = forward(text)  # never raises: an exception here fails the test with the example shown
    # Schema-valid by construction: envelope.build validates every envelope in-process (everywhere but
    # the daemon: forwarder.validation) and
    # raises EnvelopeInvalid otherwise, which would fail this test; checked again in the slow run.
    if name.endswith("slow"):
        assert schemas.errors(ENVELOPE, env) == [], env["id"]
    # What goes to the outbox and the wire: strict JSON, UTF-8 encodable (SQLite and Event Hubs).
    wire = json.dumps(env, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    wire.encode("utf-8")
    data = env["data"]
    if env["type"] == envelope.INCARNATION:
        assert oracle_valid(text), "published a document the independent check rejects"
        assert data["document"] == json.loads(text)
        count(name, "published")
    else:
        assert env["type"] == envelope.QUARANTINED
        assert not oracle_valid(text), f"quarantined a valid document: {data['errors']}"
        assert len(data["errors"]) >= 1
        for err in data["errors"]:
            assert isinstance(err["path"], str) and err["path"].startswith("/")
            assert isinstance(err["message"], str) and err["message"].strip()
            assert len(err["message"]) <= 300
        assert len(data["raw"]) <= envelope.RAW_LIMIT
        assert data["rawTruncated"] == (len(text) > envelope.RAW_LIMIT)
        assert data["raw"] == text[: envelope.RAW_LIMIT]
        assert data["rawSha256"] == hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        count(name, "quarantined")
    return env


MUTANTS = 8  # near-valid variants checked per drawn document (seeded by hypothesis)


@fuzz(1000)
@given(S.valid_document(), st.randoms(use_true_random=False))
def test_valid_documents_are_published_and_mutants_explained(doc: Dict[str, Any], rnd: Any) -> None:
    env = check("imds.valid", json.dumps(doc, ensure_ascii=rnd.random() < 0.5))
    assert env["type"] == envelope.INCARNATION
    assert env["data"]["incarnation"] == int(doc["DocumentIncarnation"])
    for _ in range(MUTANTS):
        check("imds.near-valid", json.dumps(S.mutate_document(doc, rnd)))


@fuzz(300)
@given(S.near_valid_document())
def test_near_valid_documents_are_published_or_quarantined_with_reasons(doc: Dict[str, Any]) -> None:
    check("imds.near-valid", json.dumps(doc))


@fuzz(1000)
@given(S.hostile_text())
def test_hostile_bodies_never_raise_and_are_quarantined_bounded(text: str) -> None:
    check("imds.hostile", text)


@pytest.mark.slow
@fuzz(3000 * SLOW_FACTOR)
@given(S.imds_texts)
def test_slow_many_more_imds_bodies(text: str) -> None:
    check("imds.slow", text)


class _Imds:
    """Stands in for IMDS at the client boundary (no network): what the poller's client returns."""

    api_version = "2020-07-01"

    def __init__(self) -> None:
        self.text = "{}"

    def get_compute(self) -> Dict[str, Any]:
        return {"vmId": S.VM_ID, "name": "vm0", "resourceId": VM.resource_id, "tagsList": []}

    def get_scheduled_events(self) -> ImdsResponse:
        return ImdsResponse(status=200, text=self.text, url="imds", elapsed=0.0, attempts=1)


@pytest.fixture(scope="module")
def poller_and_outbox(tmp_path_factory: pytest.TempPathFactory) -> Any:
    outbox = Outbox(Path(tmp_path_factory.mktemp("fuzz-outbox")), max_rows=100)
    imds = _Imds()
    yield poller.Poller(imds, outbox), imds, outbox  # type: ignore[arg-type]
    outbox.close()


@fuzz(150)
@given(st.one_of(S.valid_document().map(json.dumps), S.near_valid_document().map(json.dumps),
                 S.hostile_text()))
def test_the_real_poller_and_outbox_take_every_body(poller_and_outbox: Any, text: str) -> None:
    """The same bodies through Poller.poll_once and a real SQLite outbox: it never raises, and what it
    stored reads back as the envelope it built."""
    p, imds, outbox = poller_and_outbox
    imds.text = text
    result = p.poll_once()
    assert result.outcome in ("published", "unchanged", "quarantined", "quarantine-repeat")
    if result.outcome in ("published", "quarantined"):
        stored = [i for i in outbox.peek(200) if i.id == result.envelope_id]
        assert stored, result
        assert schemas.errors(ENVELOPE, stored[-1].envelope) == []
        outbox.ack([i.seq for i in outbox.peek(200)])
    count("imds.poller+outbox", result.outcome)
