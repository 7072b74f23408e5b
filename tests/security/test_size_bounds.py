"""Every input has a size bound and a clear refusal past it: the IMDS body (see
test_imds_transport.py), the quarantined envelope built from a big bad body, an approval message,
an envelope at central, and an operator decision posted to the Function app."""

from __future__ import annotations

import base64
import json
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest

import schemas
from central.intake import parse as central_envelopes
from forwarder import envelope, poller
from forwarder.approvals import message as msgs
from forwarder.approvals.approver import Approver
from forwarder.approvals.ledger import Ledger
from forwarder.approvals.reader import ApprovalReader
from forwarder.identity import VmIdentity
from forwarder.imds import MAX_BODY_BYTES
from sandbox.functions.loader import load_functions

MB = 1024 * 1024
EVENT_HUBS_LIMIT = 1024 * 1024
VM = VmIdentity("0f8fad5b-d9cb-469f-a165-70867728950e", "vm0")


def test_a_quarantined_envelope_stays_under_the_event_hubs_limit() -> None:
    """The largest body the client reads (1 MiB), valid JSON but schema-invalid: the envelope keeps
    the raw head (256 KiB) and the hash, not a second parsed copy, so it still fits one message."""
    events = [{"EventId": f"E{i}", "Resources": ["vm0"] * 200} for i in range(900)]
    text = json.dumps({"DocumentIncarnation": 1, "Events": events})
    text = text[:MAX_BODY_BYTES]  # as the client would cap it: now also not JSON
    body = json.dumps({"DocumentIncarnation": 1, "Events": events[:700]})
    assert 0.8 * MB < len(body) <= MAX_BODY_BYTES
    for raw in (body, text):
        parsed = poller.parse(raw)
        assert parsed.errors
        env = envelope.quarantined(VM, "2020-07-01", raw, parsed.errors, parsed.document,
                                   parsed.incarnation, "2026-11-21T05:00:00Z")
        assert schemas.errors("envelope.schema.json", env) == []
        assert env["data"]["rawTruncated"] is True and env["data"]["document"] is None
        size = len(json.dumps(env, ensure_ascii=False).encode("utf-8"))
        assert size < EVENT_HUBS_LIMIT, size


@dataclass
class _Item:
    id: str
    content: Any
    dequeue_count: int = 1
    pop_receipt: str = "r"


class _NoImds:
    def get_scheduled_events(self) -> Any:
        raise AssertionError("an oversized message must be refused before IMDS is asked")

    def start_events(self, event_ids: Any) -> Any:
        raise AssertionError("never POST")


def test_a_huge_approval_message_is_rejected_unread(tmp_path: Path) -> None:
    approver = Approver(_NoImds(), Ledger(str(tmp_path)), VM.vm_id, VM.name)  # type: ignore[arg-type]
    reader = ApprovalReader(queue=None, approver=approver, ledger=approver.ledger, publish=lambda r: None)
    huge = json.dumps({"schemaVersion": 1, "reason": "x" * (5 * MB)})
    result = reader._decide(_Item("q-huge", huge))
    assert result is not None and result.outcome == "rejected"
    assert result.reason.startswith("malformed:") and "larger than any approval" in result.reason
    assert len(json.dumps(result.as_record())) < 10_000  # the result keeps a bounded head only
    # Just under the queue's 64 KiB but over the schema's field limits: refused by the schema.
    near = json.dumps({"schemaVersion": 1, "messageId": "0" * 32, "eventId": "E" * 60_000})
    try:
        msgs.validate(msgs.decode(near))
        raise AssertionError("accepted an oversized eventId")
    except msgs.Rejected as exc:
        assert exc.reason.startswith("forged:")


def test_a_huge_envelope_at_central_is_quarantined_without_parsing() -> None:
    body = b'{"specversion": "1.0", "data": {"pad": "' + b"x" * (50 * MB) + b'"}}'
    tracemalloc.start()
    try:
        item = central_envelopes.parse_body(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(item, central_envelopes.BadEnvelope)
    assert "larger than" in item.errors[0]["message"] and "Event Hubs" in item.errors[0]["message"]
    assert len(item.text) <= central_envelopes.MAX_BODY_BYTES
    assert peak < 8 * MB, peak  # the 50 MB body was never decoded or parsed whole


def _decide() -> Any:
    # The loader indexes the FunctionApp once per process (a second get_functions() raises).
    return next(spec.callable for spec in load_functions("function_app") if spec.name == "decide")


def test_a_huge_operator_decision_body_gets_413_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A signed-in Operator, as the platform passes one (central reads it only with WEBSITE_AUTH_ENABLED).
    monkeypatch.setenv("WEBSITE_AUTH_ENABLED", "True")
    principal = base64.b64encode(json.dumps({"claims": [
        {"typ": "oid", "val": "o-1"}, {"typ": "preferred_username", "val": "ops@example.com"},
        {"typ": "roles", "val": "Operator"}]}).encode()).decode()
    body = json.dumps({"reason": "r" * (5 * MB)}).encode()
    req = func.HttpRequest("POST", "/api/events/E1/approve", body=body,
                           headers={"X-MS-CLIENT-PRINCIPAL": principal},
                           route_params={"event_id": "E1", "action": "approve"})
    resp = _decide()(req)  # refused before central is built: no settings or storage needed
    assert resp.status_code == 413
    assert "larger than" in json.loads(resp.get_body())["error"]
