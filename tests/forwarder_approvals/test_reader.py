"""The approval reader end to end over real sockets: simulator (IMDS), Azurite (queue), SQLite outbox."""

from __future__ import annotations

import base64
import json
import threading

import schemas
from forwarder.approvals.reader import IDLE_WAIT

from .helpers import VM0, VM1, Rig, approval


def _event(rig: Rig, **spec) -> str:
    spec.setdefault("eventType", "Reboot")
    spec.setdefault("resources", ["vm0"])
    return rig.sim.add_event(**spec)["eventId"]


def test_valid_approval_posts_once_and_the_event_starts(rig: Rig) -> None:
    event_id = _event(rig)
    msg = approval(event_id)
    rig.send(msg)
    rig.observe()
    rig.poll()
    posts = rig.posts()
    assert len(posts) == 1 and posts[0]["vm"] == "vm0"
    assert json.loads(posts[0]["body"]) == {"StartRequests": [{"EventId": event_id}]}
    assert rig.sim.event(event_id)["state"] == "Started"
    (result,) = rig.results()
    assert result["data"]["outcome"] == "approved"
    assert result["data"]["messageId"] == msg["messageId"]
    assert result["data"]["decidedBy"] == "policy:test-rule"
    assert result["partitionkey"] == VM0["vmId"]
    assert schemas.errors("envelope.schema.json", result) == []
    assert rig.queue_empty()


def test_message_kept_until_the_result_is_durable(rig: Rig) -> None:
    from forwarder.outbox import Outbox
    from sandbox.imds.client import wait_for

    event_id = _event(rig)
    rig.send(approval(event_id))
    rig.outbox.close()  # the outbox cannot take the result (as on a full or broken disk)
    rig.poll()
    assert len(rig.posts()) == 1
    assert list(rig.queue.peek_messages()) == []  # invisible, not deleted:
    assert rig.queue.get_queue_properties().approximate_message_count == 1
    rig.outbox = rig.service.outbox = Outbox(rig.state_dir)  # the disk is back
    wait_for(lambda: list(rig.queue.peek_messages()), timeout=15, interval=0.2)  # visibility timeout
    rig.poll()
    assert len(rig.posts()) == 1, "the second pass reports without a second POST"
    assert rig.outcomes() == [("approved", "already approved by this message (second pass)")]
    assert rig.queue_empty()


def test_base64_encoded_message_is_accepted(rig: Rig) -> None:
    event_id = _event(rig)
    rig.send(base64.b64encode(json.dumps(approval(event_id)).encode()).decode())
    rig.poll()
    assert len(rig.posts()) == 1
    assert rig.outcomes()[0][0] == "approved"


def _rejected(rig: Rig, message, keyword: str) -> str:
    rig.send(message)
    rig.poll()
    assert rig.posts() == [], "nothing may be approved"
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "rejected"
    assert reason.startswith(keyword), reason
    assert rig.queue_empty(), "a rejected message is deleted once its result is durable"
    return reason


def test_forged_schema_invalid_message_rejected(rig: Rig) -> None:
    event_id = _event(rig)
    reason = _rejected(rig, approval(event_id, action="reboot-now"), "forged")
    assert "/action" in reason


def test_forged_extra_field_rejected(rig: Rig) -> None:
    event_id = _event(rig)
    _rejected(rig, approval(event_id, startEverything=True), "forged")


def test_stale_message_rejected(rig: Rig) -> None:
    event_id = _event(rig)
    _rejected(rig, approval(event_id, expires_in=-5), "stale")
    assert rig.sim.event(event_id)["state"] == "Scheduled"


def test_foreign_vm_id_rejected(rig: Rig) -> None:
    event_id = _event(rig, resources=["vm0", "vm1"])
    _rejected(rig, approval(event_id, vm=VM1), "foreign")


def test_vm_not_in_resources_rejected(rig: Rig) -> None:
    # vm0 sees the event (same availability set) but it is only vm1's
    event_id = _event(rig, resources=["vm1"], audience=["vm0", "vm1"])
    reason = _rejected(rig, approval(event_id), "foreign")
    assert "Resources" in reason


def test_unknown_event_rejected(rig: Rig) -> None:
    _event(rig)
    _rejected(rig, approval("C7061BAC-AFDC-4513-B24B-AA5F13A16123"), "unknown-event")


def test_event_already_started_rejected(rig: Rig) -> None:
    event_id = _event(rig, status="Started")
    _rejected(rig, approval(event_id), "not-scheduled")


def test_malformed_messages_rejected_and_kept_locally(rig: Rig) -> None:
    garbage = base64.b64encode(b"\xff\xfe garbage").decode()
    for body in ("not json at all", garbage, "[1, 2]", "{\"broken\": "):
        rig.send(body)
    rig.poll()
    assert rig.posts() == []
    outcomes = rig.outcomes()
    assert len(outcomes) == 4
    assert all(o == "rejected" and r.startswith("malformed") for o, r in outcomes), outcomes
    assert rig.queue_empty()
    assert len(list((rig.state_dir / "rejected").glob("*.json"))) == 4  # nothing lost


def test_same_message_twice_posts_once(rig: Rig) -> None:
    event_id = _event(rig)
    msg = approval(event_id)
    rig.send(msg)
    rig.send(msg)
    rig.poll()
    assert len(rig.posts()) == 1
    outcomes = rig.outcomes()
    assert [o for o, _ in outcomes] == ["approved", "approved"]  # the second pass re-reports, no action
    assert rig.queue_empty()


def test_second_message_for_approved_event_is_duplicate(rig: Rig) -> None:
    event_id = _event(rig)
    rig.send(approval(event_id))
    rig.poll()
    rig.send(approval(event_id))
    rig.poll()
    assert len(rig.posts()) == 1
    assert [o for o, _ in rig.outcomes()] == ["approved", "rejected"]
    assert rig.outcomes()[1][1].startswith("duplicate")


def test_leader_approves_for_the_group(rig: Rig) -> None:
    # a Freeze of vm0 and vm1; central named vm0 the leader: one POST from vm0 starts it for both
    event_id = _event(rig, eventType="Freeze", resources=["vm0", "vm1"])
    rig.send(approval(event_id))
    rig.poll()
    assert [p["vm"] for p in rig.posts()] == ["vm0"]
    assert rig.sim.document("vm1")["Events"][0]["EventStatus"] == "Started"


def test_missing_queue_is_no_messages(rig: Rig) -> None:
    rig.queue.delete_queue()
    rig.poll()
    rig.poll()
    assert rig.service.reader is not None
    assert rig.service.reader.queue_missing
    assert rig.service.reader.stats["errors"] == 0
    assert rig.service.reader.interval() == IDLE_WAIT  # no Scheduled event: not read at all


def test_the_queue_is_read_only_while_this_vm_has_a_scheduled_event(rig: Rig) -> None:
    rig.observe()
    assert rig.service.reader is None  # idle: no reader built, the queue SDK client not even made
    rig.service.step(threading.Event())  # the worker's step while idle: waits, reads nothing
    assert rig.service.reader is None
    reader = rig.service.ensure_reader()
    assert reader.interval() == IDLE_WAIT
    reader.step(max_wait=0.2)
    assert reader.stats["receives"] == 0
    _event(rig, resources=["vm1"], audience=["vm0", "vm1"])  # not ours
    rig.observe()
    reader.step(max_wait=0.2)
    assert reader.interval() == IDLE_WAIT and reader.stats["receives"] == 0
    event_id = _event(rig)
    rig.observe()
    assert reader.interval() == 0.2
    reader.step(max_wait=0.2)
    assert reader.stats["receives"] == 1
    rig.sim.cancel(event_id)
    rig.observe()
    reader.step(max_wait=0.2)
    assert reader.interval() == IDLE_WAIT and reader.stats["receives"] == 1


def test_the_worker_builds_the_reader_when_an_event_appears(rig: Rig) -> None:
    stop = threading.Event()
    rig.observe()
    rig.service.step(stop)
    assert rig.service.reader is None
    _event(rig)
    rig.observe()
    rig.service.step(stop)  # builds the reader and reads at once
    assert rig.service.reader is not None and rig.service.reader.stats["receives"] >= 1


def test_poison_message_deleted_after_report(rig: Rig) -> None:
    event_id = _event(rig)
    rig.send(approval(event_id))
    for _ in range(3):  # three receives that never finish (a crashing reader): dequeue count 3
        (item,) = list(rig.queue.receive_messages(visibility_timeout=1, max_messages=1))
        rig.queue.update_message(item, visibility_timeout=0)
    rig.poll()  # dequeue count 4 > limit 3
    assert rig.posts() == []
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "rejected" and reason.startswith("poison"), reason
    assert rig.results()[0]["data"]["eventId"] == event_id
    assert rig.queue_empty()
    assert list((rig.state_dir / "rejected").glob("*.json"))


def test_poison_message_moved_when_allowed(rig: Rig) -> None:
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.queue import QueueClient

    from forwarder.approvals.queue import poison_queue_name

    reader = rig.service.ensure_reader()
    poison = QueueClient.from_connection_string(rig.service.settings.queue_connection_string,
                                                poison_queue_name(rig.queue.queue_name))
    try:
        poison.create_queue()
    except ResourceExistsError:  # from an earlier run
        poison.clear_messages()
    reader.poison_queue = poison
    rig.send("garbage that keeps failing")
    for _ in range(3):
        (item,) = list(rig.queue.receive_messages(visibility_timeout=1, max_messages=1))
        rig.queue.update_message(item, visibility_timeout=0)
    rig.poll()
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "rejected" and "moved to queue" in reason
    assert [m.content for m in poison.peek_messages()] == ["garbage that keeps failing"]
    assert rig.queue_empty()
    poison.delete_queue()


def test_message_sent_by_central_is_carried_out(rig: Rig) -> None:
    """The contract through a real queue: central's builder and sender, this forwarder's reader."""
    from datetime import datetime, timedelta, timezone

    import pytest

    central = pytest.importorskip("central.runtime.approval_queue")
    from azure.storage.queue import QueueServiceClient

    event_id = _event(rig)
    now = datetime.now(timezone.utc)
    expires = now + timedelta(minutes=10)
    message = central.build_message(event_id, VM0["vmId"], "vm0", "approve", "policy:user-reboots",
                                    "user-initiated", 1, now, expires)
    service = QueueServiceClient.from_connection_string(rig.service.settings.queue_connection_string)
    try:
        sent_to = central.ApprovalSender(service).send(message, now, expires)
    finally:
        service.close()
    assert sent_to == rig.queue.queue_name
    rig.poll()
    assert len(rig.posts()) == 1
    (result,) = rig.results()
    assert result["data"]["outcome"] == "approved" and result["data"]["messageId"] == message["messageId"]


def test_rejection_reason_is_logged_with_fields(rig: Rig, caplog) -> None:
    import logging

    event_id = _event(rig)
    with caplog.at_level(logging.INFO, logger="forwarder.approvals"):
        rig.send(approval(event_id, expires_in=-1))
        rig.poll()
    logged = [getattr(r, "fields", {}) for r in caplog.records if r.name == "forwarder.approvals.reader"]
    ours = [f for f in logged if f.get("outcome") == "rejected"]
    assert ours and ours[0]["reason"].startswith("stale") and ours[0]["eventId"] == event_id
