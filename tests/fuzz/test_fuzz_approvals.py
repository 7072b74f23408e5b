"""Approval messages (valid, mutated, hostile) through the VM's own checks against a fixed live-IMDS
document, in the order the queue reader applies them: decode -> schema -> addressed to this VM ->
fresh -> the live IMDS gate. Nothing may raise; every rejection carries a reason; and NOTHING is
approved unless an independent oracle (written here, from the schema file and the rules in
DESIGN.md) agrees: schema-valid, unexpired, addressed to this VM, for an event IMDS lists now as
Scheduled with this VM in Resources. A second test drives the real ApprovalReader + Approver +
Ledger, with IMDS stood in by an object that records POSTs.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator, FormatChecker

from forwarder import envelope
from forwarder.approvals import gate
from forwarder.approvals import message as msgs
from forwarder.approvals.approver import Approver
from forwarder.approvals.ledger import Ledger
from forwarder.approvals.reader import ApprovalReader, ReaderSettings
from forwarder.imds import ImdsResponse
from forwarder.outbox import Outbox

from . import strategies as S
from .counting import SLOW_FACTOR, count, fuzz

VM_ID, VM_NAME = S.VM_ID, "vm0"
NOW = datetime(2026, 11, 21, 5, 0, tzinfo=timezone.utc)
SKEW = 300.0


def _event(event_id: str, status: str, resources: List[str]) -> Dict[str, Any]:
    return {"EventId": event_id, "EventStatus": status, "EventType": "Reboot",
            "ResourceType": "VirtualMachine", "Resources": resources,
            "NotBefore": "" if status == "Started" else "Sat, 21 Nov 2026 05:15:00 GMT"}


# The fixed live state: one approvable event, and one of each way an event is not approvable.
LIVE = {"DocumentIncarnation": 7, "Events": [
    _event("E1-SCHEDULED-MINE", "Scheduled", ["vm1", "vm0"]),
    _event("E2-STARTED-MINE", "Started", ["vm0"]),
    _event("E3-SCHEDULED-OTHERS", "Scheduled", ["vm1", "vm00", "VM0"]),
    _event("E4-SCHEDULED-NOBODY", "Scheduled", []),
]}
LIVE_TEXT = json.dumps(LIVE)
EVENT_IDS = ["E1-SCHEDULED-MINE", "E2-STARTED-MINE", "E3-SCHEDULED-OTHERS", "E4-SCHEDULED-NOBODY",
             "E5-UNKNOWN", "e1-scheduled-mine"]
VM_IDS = [VM_ID, VM_ID.upper(), "11111111-2222-3333-4444-555555555555"]
VM_NAMES = [VM_NAME, "vm1", "VM0", "vm0 "]

_SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "approval.schema.json").read_text("utf-8"))
_VALIDATOR = Draft202012Validator(_SCHEMA, format_checker=FormatChecker())


def oracle(body: Any, live: Dict[str, Any], now: datetime) -> bool:
    """May this message lead to an approval? Written from the rules, not from forwarder code."""
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            return False
    if not isinstance(body, str) or len(body) > 128 * 1024:
        return False
    text = body.strip()
    try:
        if not text.startswith("{"):
            text = base64.b64decode(text, validate=True).decode("utf-8")
        obj = json.loads(text)
    except (ValueError, binascii.Error, RecursionError):
        return False
    if not isinstance(obj, dict) or not _VALIDATOR.is_valid(obj):
        return False
    try:  # text that cannot be stored as UTF-8 (a lone surrogate escape) is not a message
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    try:
        issued = datetime.fromisoformat(obj["issuedAt"].replace("z", "Z"))
        expires = datetime.fromisoformat(obj["expiresAt"].replace("z", "Z"))
    except ValueError:
        return False
    if issued.tzinfo is None or expires.tzinfo is None:
        return False
    if not (now < expires and issued < expires and (issued - now).total_seconds() <= SKEW):
        return False
    if obj["vmId"].lower() != VM_ID.lower() or obj["vmName"] != VM_NAME:
        return False
    # an EventId is a GUID: compared ignoring case (central may spell it as Event Grid does)
    listed = [e for e in live["Events"] if e["EventId"].lower() == obj["eventId"].lower()]
    return bool(listed) and listed[0]["EventStatus"] == "Scheduled" and VM_NAME in listed[0]["Resources"]


def vm_decides(body: Any, now: datetime = NOW) -> Tuple[str, str]:
    """The VM's checks in the reader's order; ("approved", event id) or ("rejected", reason)."""
    try:
        approval = msgs.validate(msgs.decode(body))
        msgs.check_addressed(approval, VM_ID, VM_NAME)
        msgs.check_fresh(approval, now, SKEW)
        event = gate.check_event(gate.parse_document(LIVE_TEXT), approval.event_id, VM_NAME)
    except msgs.Rejected as exc:
        return "rejected", exc.reason
    return "approved", str(event["EventId"])


KEYWORDS = ("malformed", "forged", "foreign", "stale", "not-scheduled", "unknown-event", "imds")


def check(name: str, body: Any) -> str:
    outcome, detail = vm_decides(body)  # never raises: an exception fails the test with the example
    allowed = oracle(body, LIVE, NOW)
    if outcome == "approved":
        assert allowed, f"approved a message the oracle refuses: {body!r:.300}"
        assert detail == "E1-SCHEDULED-MINE"
    else:
        assert detail.strip() and detail.split(":")[0] in KEYWORDS, detail
        assert len(detail) <= 1200
        if isinstance(body, str) and body.startswith("{"):  # plain JSON: the two must agree exactly
            assert not allowed, f"rejected ({detail}) a message the oracle accepts: {body:.300}"
    count(name, outcome if outcome == "approved" else f"rejected:{detail.split(':')[0]}")
    return outcome


base = S.approval_message(NOW, VM_IDS, VM_NAMES, EVENT_IDS)
MUTANTS = 4


@fuzz(1400)
@given(base, st.randoms(use_true_random=False))
def test_valid_and_mutated_messages_approve_only_what_the_oracle_allows(msg: Dict[str, Any],
                                                                        rnd: Any) -> None:
    check("approval.valid", json.dumps(msg))
    check("approval.valid-base64", base64.b64encode(json.dumps(msg).encode()).decode())
    for _ in range(MUTANTS):  # one field dropped, broken or re-cased: cheap near-valid variants
        mutant = dict(msg)
        key = rnd.choice(S.APPROVAL_FIELDS)
        how = rnd.random()
        if how < 0.3:
            mutant.pop(key)
        elif how < 0.8:
            mutant[key] = rnd.choice([None, 0, 2, -1, 1.5, "", "x" * 2000, [], {}, "2026-13-01T00:00:00Z",
                                      "2026-11-21T05:00:00", "approve-now", "APPROVE", True])
        elif isinstance(mutant[key], str):
            mutant[key] = mutant[key].upper() if rnd.random() < 0.5 else " " + mutant[key]
        else:
            mutant["unexpected"] = 1
        check("approval.mutated", json.dumps(mutant))


@fuzz(1000)
@given(S.mutated_approval(base))
def test_schema_driven_mutations(msg: Dict[str, Any]) -> None:
    check("approval.mutated", json.dumps(msg))


@fuzz(1000)
@given(S.hostile_approval_body(base))
def test_hostile_bodies_are_rejected_with_a_reason(body: Any) -> None:
    check("approval.hostile", body)


@pytest.mark.slow
@fuzz(1000 * SLOW_FACTOR)
@given(st.one_of(base.map(json.dumps), S.mutated_approval(base).map(json.dumps),
                 S.hostile_approval_body(base)))
def test_slow_many_more_messages(body: Any) -> None:
    check("approval.slow", body)


# ---- the real reader, approver and ledger --------------------------------------------------------

class _Imds:
    """IMDS at the client boundary: answers the fixed document, records every approval POST."""

    def __init__(self) -> None:
        self.posts: List[List[str]] = []

    def get_scheduled_events(self) -> ImdsResponse:
        return ImdsResponse(status=200, text=LIVE_TEXT, url="imds", elapsed=0.0, attempts=1)

    def start_events(self, event_ids: Any) -> ImdsResponse:
        self.posts.append(list(event_ids))
        return ImdsResponse(status=200, text="", url="imds", elapsed=0.0, attempts=1)


@dataclass
class _Item:
    """A queue message as the Storage SDK hands it over."""

    id: str
    content: Any
    dequeue_count: int = 1
    pop_receipt: str = "r"


class _Queue:
    def delete_message(self, message_id: str, pop_receipt: str) -> None:
        pass


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Tuple[ApprovalReader, _Imds, Outbox]]:
    imds, outbox = _Imds(), Outbox(tmp_path / "outbox", max_rows=100_000)
    vm = S._vm()
    approver = Approver(imds, Ledger(str(tmp_path)), VM_ID, VM_NAME)

    def publish(result: Any) -> None:  # as ApprovalService.publish: durable in the real outbox
        outbox.put(envelope.approval_result(vm, result.data(vm.as_vm())))

    yield (ApprovalReader(queue=_Queue(), approver=approver, ledger=approver.ledger, publish=publish,
                          settings=ReaderSettings(max_clock_skew=SKEW)), imds, outbox)
    outbox.close()


@fuzz(150)
@given(st.data())
def test_the_real_reader_posts_only_what_the_oracle_allows(reader: Any, data: Any) -> None:
    """Messages made around the real clock go through ApprovalReader.handle (ledger, approver, gate,
    result into a real SQLite outbox): a POST happens only for a message the oracle accepts, at most
    once per event, and every message's result is durable."""
    rd, imds, outbox = reader
    now = datetime.now(timezone.utc)
    strategy = S.approval_message(now, VM_IDS, VM_NAMES, EVENT_IDS)
    body = data.draw(st.one_of(strategy.map(json.dumps), S.mutated_approval(strategy).map(json.dumps),
                               S.hostile_approval_body(strategy)))
    before, backlog = len(imds.posts), outbox.backlog()
    rd.handle(_Item(id="q1", content=body))
    assert outbox.backlog() == backlog + 1, "the result of this message is not durable"
    result = outbox.peek(100_000)[-1].envelope["data"]
    assert result["reason"]
    posted = len(imds.posts) - before
    if posted:
        later = datetime.now(timezone.utc) - timedelta(seconds=5)
        assert oracle(body, LIVE, later) or oracle(body, LIVE, now)
        assert imds.posts[-1] == ["E1-SCHEDULED-MINE"]
    assert sum(1 for p in imds.posts if p == ["E1-SCHEDULED-MINE"]) <= 1, "approved twice"
    count("approval.real-reader", f"{result['outcome']}{'+POST' if posted else ''}")
