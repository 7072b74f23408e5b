"""The daemon's schema checks in a child process (forwarder/validation.py): the same answers as in-process,
a clear ValidationUnavailable when the child gives none, and a document it could not check is handled again.
Real child processes (`python -m forwarder.validation`), the real IMDS simulator."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from forwarder import validation
from forwarder.approvals import message as msgs
from forwarder.imds import ImdsClient
from forwarder.outbox import Outbox
from forwarder.poller import Poller
from sandbox import processes

from .helpers import admin, imds_url

IMDS = "imds-scheduled-events.schema.json"
INSTANCES: list = [
    (IMDS, {"DocumentIncarnation": 1, "Events": []}),
    (IMDS, {"DocumentIncarnation": "x", "Events": [{"EventId": "é-ü", "EventType": "Reboot"}]}),
    (IMDS, [1, 2]),
    ("approval.schema.json", {"messageId": "m", "eventId": "E", "action": "approve", "reason": "ñ" * 400}),
]


@pytest.fixture
def in_child() -> Iterator[None]:
    validation.use_child_process()
    try:
        yield
    finally:
        validation.use_child_process(False)


@pytest.mark.parametrize("schema,instance", INSTANCES)
def test_the_child_answers_what_the_library_answers_in_process(schema: str, instance: Any) -> None:
    here = validation.errors(schema, instance, limit=5)
    validation.use_child_process()
    try:
        there = validation.errors(schema, instance, limit=5)
    finally:
        validation.use_child_process(False)
    assert there == here
    assert (here == []) == (instance == INSTANCES[0][1])  # one valid instance, three invalid ones


def test_no_answer_is_validation_unavailable_in_one_line(in_child: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(validation.ValidationUnavailable, match=r"failed \(exit 1\): FileNotFoundError"):
        validation.errors("no-such.schema.json", {})
    monkeypatch.setattr(sys, "executable", str(tmp_path / "missing-python"))
    with pytest.raises(validation.ValidationUnavailable, match="could not run"):
        validation.errors(IMDS, {})
    assert validation.checks_own_output() is False  # the daemon leaves its envelopes to central


def test_a_message_that_cannot_be_checked_is_not_rejected(in_child: None, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    """Unchecked is not forged: the reader leaves the message in the queue for a later pass."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "missing-python"))
    with pytest.raises(validation.ValidationUnavailable):
        msgs.validate({"messageId": "m"})


def test_a_document_the_child_could_not_check_is_handled_at_the_next_poll(
        in_child: None, imds_server: processes.Server, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = Outbox(tmp_path / "state")
    poller = Poller(ImdsClient(imds_url(imds_server)), outbox)
    try:
        assert poller.poll_once().outcome == "published"
        admin(imds_server, "POST", "events", {"eventType": "Reboot", "noticeSeconds": 900})
        real = sys.executable
        monkeypatch.setattr(sys, "executable", str(tmp_path / "missing-python"))
        with pytest.raises(validation.ValidationUnavailable):
            poller.poll_once()
        assert poller.last_incarnation == 1  # nothing published, nothing remembered as handled
        monkeypatch.setattr(sys, "executable", real)
        again = poller.poll_once()
        assert again.outcome == "published" and again.incarnation == 2
        assert [e.type for e in outbox.peek(10)].count("scheduledevents.incarnation.v1") == 2
    finally:
        outbox.close()
