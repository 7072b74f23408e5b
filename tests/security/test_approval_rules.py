"""One test per approval rule, each a single change to a message that is otherwise approved, through
the VM's checks in the reader's order against a fixed live IMDS document (no network). The rules
also run against the simulator and Azurite in tests/forwarder_approvals/test_reader.py; the
properties over thousands of messages are in tests/fuzz/test_fuzz_approvals.py."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any, Dict

import pytest

from forwarder.approvals import gate
from forwarder.approvals import message as msgs

VM_ID, VM_NAME = "0f8fad5b-d9cb-469f-a165-70867728950e", "vm0"
NOW = datetime(2026, 11, 21, 5, 0, tzinfo=timezone.utc)


def ev(event_id: str, status: str, resources: list) -> Dict[str, Any]:
    not_before = "" if status == "Started" else "Sat, 21 Nov 2026 05:15:00 GMT"
    return {"EventId": event_id, "EventStatus": status, "EventType": "Reboot",
            "ResourceType": "VirtualMachine", "Resources": resources, "NotBefore": not_before}


LIVE = json.dumps({"DocumentIncarnation": 3, "Events": [
    ev("E1", "Scheduled", ["vm1", "vm0"]), ev("E2", "Started", ["vm0"]), ev("E3", "Scheduled", ["vm1"])]})


def message(**change: Any) -> Dict[str, Any]:
    msg = {"schemaVersion": 1, "messageId": "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b", "eventId": "E1",
           "vmId": VM_ID, "vmName": VM_NAME, "action": "approve", "decidedBy": "policy:default",
           "reason": "user reboot", "issuedAt": "2026-11-21T04:59:00Z", "expiresAt": "2026-11-21T05:10:00Z"}
    msg.update(change)
    return {k: v for k, v in msg.items() if v is not None}


def decide(msg: Dict[str, Any], now: datetime = NOW, live: str = LIVE) -> str:
    try:
        approval = msgs.validate(msgs.decode(json.dumps(msg)))
        msgs.check_addressed(approval, VM_ID, VM_NAME)
        msgs.check_fresh(approval, now)
        gate.check_event(gate.parse_document(live), approval.event_id, VM_NAME)
    except msgs.Rejected as exc:
        return exc.reason
    return "approved"


def test_the_baseline_message_is_approved() -> None:
    assert decide(message()) == "approved"
    assert decide(message(vmId=VM_ID.upper())) == "approved"  # vmId compares case-insensitively
    # so does the EventId (a GUID central may spell as Event Grid does), and the POST names IMDS's spelling
    assert decide(message(eventId="e1")) == "approved"
    assert gate.check_event(gate.parse_document(LIVE), "e1", VM_NAME)["EventId"] == "E1"


@pytest.mark.parametrize(("change", "now", "keyword"), [
    ({"schemaVersion": 2}, NOW, "forged"),
    ({"action": "approve-now"}, NOW, "forged"),
    ({"extra": "field"}, NOW, "forged"),
    ({"reason": None}, NOW, "forged"),  # required
    ({"expiresAt": "tomorrow"}, NOW, "forged"),
    ({}, NOW + timedelta(minutes=10), "stale"),  # exactly at expiresAt
    ({}, NOW + timedelta(hours=1), "stale"),
    ({"issuedAt": "2026-11-21T05:20:00Z", "expiresAt": "2026-11-21T05:30:00Z"}, NOW, "forged"),  # future
    ({"expiresAt": "2026-11-21T04:58:00Z"}, datetime(2026, 11, 21, 4, 57, tzinfo=timezone.utc), "forged"),
    ({"vmId": "11111111-2222-3333-4444-555555555555"}, NOW, "foreign"),
    ({"vmName": "vm1"}, NOW, "foreign"),
    ({"vmName": "VM0"}, NOW, "foreign"),  # names match IMDS exactly
    ({"eventId": "E9"}, NOW, "unknown-event"),
    ({"eventId": "E2"}, NOW, "not-scheduled"),
    ({"eventId": "E3"}, NOW, "foreign"),  # listed, Scheduled, but this VM is not in Resources
])
def test_each_rule_rejects_with_its_reason(change: Dict[str, Any], now: datetime, keyword: str) -> None:
    reason = decide(message(**change), now)
    assert reason != "approved" and reason.startswith(keyword + ":"), reason


@pytest.mark.parametrize("live", ["not json", json.dumps({"DocumentIncarnation": 1}), "[" * 2000])
def test_an_unreadable_live_document_never_approves(live: str) -> None:
    assert decide(message(), live=live).startswith("imds:")
