"""IMDS simulator conformance, the document and the event lifecycle: fields by api-version,
DocumentIncarnation, StartRequests, Scheduled -> Started -> gone, cancellation, Started without
Scheduled, several VMs sharing an event. Time scale 600: 15 simulated minutes pass in 1.5 s."""

from __future__ import annotations

import json
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any, Dict, Iterator, List

import pytest

import schemas
from sandbox.imds.client import ImdsSimulator, wait_for
from tests.sandbox.simulator import running

SE = "/metadata/scheduledevents"
SCALE = 600.0
HOUR = 3600  # simulated seconds: 6 s real, longer than any test here waits


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImdsSimulator]:
    yield from running(["--time-scale", str(SCALE), "--rate-limit", "0",
                        "--vm", "vm0", "--vm", "vm1", "--vm", "vm2"],
                       tmp_path_factory.mktemp("imds"))


@pytest.fixture(autouse=True)
def _fresh(sim: ImdsSimulator) -> None:
    sim.reset()


def _events(sim: ImdsSimulator, vm: str = "vm0", version: str = "2020-07-01") -> List[Dict[str, Any]]:
    return sim.scheduled_events(vm, version)["Events"]


def _status(sim: ImdsSimulator, event_id: str, vm: str = "vm0") -> str:
    """'Scheduled' | 'Started' | 'gone' as VM `vm` sees it."""
    found = [e for e in _events(sim, vm) if e["EventId"] == event_id]
    return found[0]["EventStatus"] if found else "gone"


@pytest.mark.parametrize("version,types,fields", [
    ("2017-03-01", {"Freeze"}, set()),
    ("2017-08-01", {"Freeze"}, set()),
    ("2017-11-01", {"Freeze", "Preempt"}, set()),
    ("2019-01-01", {"Freeze", "Preempt", "Terminate"}, set()),
    ("2019-04-01", {"Freeze", "Preempt", "Terminate"}, {"Description"}),
    ("2019-08-01", {"Freeze", "Preempt", "Terminate"}, {"Description", "EventSource"}),
    ("2020-07-01", {"Freeze", "Preempt", "Terminate"}, {"Description", "EventSource", "DurationInSeconds"}),
])
def test_fields_and_event_types_filtered_by_api_version(sim: ImdsSimulator, version: str, types: set,
                                                        fields: set) -> None:
    for kind in ("Freeze", "Preempt", "Terminate"):
        sim.add_event(eventType=kind, noticeSeconds=HOUR)
    doc = sim.scheduled_events("vm0", version)
    assert schemas.errors("imds-scheduled-events.schema.json", doc) == []
    assert {e["EventType"] for e in doc["Events"]} == types  # an unknown type is omitted, not shown
    base = {"EventId", "EventStatus", "EventType", "ResourceType", "Resources", "NotBefore"}
    for event in doc["Events"]:
        assert set(event) == base | fields
    assert doc["DocumentIncarnation"] == 4  # the incarnation is the VM's, whatever the version


def test_incarnation_increments_on_every_change_and_only_then(sim: ImdsSimulator) -> None:
    start = sim.scheduled_events()
    assert sim.scheduled_events() == start  # nothing changed: same incarnation, same content
    event = sim.add_event(eventType="Freeze", noticeSeconds=HOUR, startedSeconds=HOUR)
    scheduled = sim.scheduled_events()
    assert scheduled["DocumentIncarnation"] == start["DocumentIncarnation"] + 1
    assert sim.scheduled_events() == scheduled
    assert sim.approve([event["eventId"]]).status_code == 200
    started = sim.scheduled_events()
    assert started["DocumentIncarnation"] == scheduled["DocumentIncarnation"] + 1
    assert sim.approve([event["eventId"]]).status_code == 200  # again: no change, no increment
    assert sim.scheduled_events() == started
    sim.cancel(event["eventId"])
    gone = sim.scheduled_events()
    assert gone == {"DocumentIncarnation": started["DocumentIncarnation"] + 1, "Events": []}


def test_not_before_is_the_scaled_wall_clock_instant_rfc1123_whole_second(sim: ImdsSimulator) -> None:
    before = time.time()
    event = sim.add_event(eventType="Reboot")  # default notice: 15 simulated minutes = 1.5 s here
    after = time.time()
    not_before = _events(sim)[0]["NotBefore"]
    assert not_before == event["notBefore"] and not_before.endswith(" GMT")
    instant = parsedate_to_datetime(not_before).timestamp()
    assert before + 900 / SCALE <= instant <= after + 900 / SCALE + 1


def test_approval_starts_the_event_and_clears_not_before(sim: ImdsSimulator) -> None:
    event = sim.add_event(eventType="Freeze", eventSource="User", noticeSeconds=HOUR, startedSeconds=HOUR)
    assert _status(sim, event["eventId"]) == "Scheduled"
    assert sim.approve([event["eventId"]]).status_code == 200
    started = _events(sim)[0]
    assert (started["EventStatus"], started["NotBefore"]) == ("Started", "")
    assert sim.event(event["eventId"])["approvedBy"] == ["vm0"]


def test_start_request_for_a_known_id_is_200_even_if_already_approved(sim: ImdsSimulator) -> None:
    event = sim.add_event(eventType="Reboot", resources=["vm0", "vm1"], noticeSeconds=HOUR,
                          startedSeconds=HOUR)
    assert sim.approve([event["eventId"]], vm="vm0").status_code == 200
    assert sim.approve([event["eventId"]], vm="vm1").status_code == 200
    assert sim.approve([event["eventId"]], vm="vm0").status_code == 200
    assert sim.event(event["eventId"])["approvedBy"] == ["vm0", "vm1", "vm0"]


@pytest.mark.parametrize("body", [
    b"not json", b"", b"[]", b'"StartRequests"', b"{}", b'{"StartRequests": {}}', b'{"StartRequests": []}',
    b'{"StartRequests": ["id"]}', b'{"StartRequests": [{}]}', b'{"StartRequests": [{"EventId": 7}]}',
    b'{"StartRequests": [{"EventId": ""}]}', b'\xff\xfe{"StartRequests": []}',
], ids=["text", "empty", "list", "string", "no-StartRequests", "object", "empty-list", "item-string",
        "no-EventId", "EventId-int", "EventId-empty", "not-utf8"])
def test_malformed_start_requests_are_400(sim: ImdsSimulator, body: bytes) -> None:
    event = sim.add_event(eventType="Reboot", noticeSeconds=HOUR)
    response = sim.metadata("POST", SE, data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"].startswith("Bad request")
    assert _status(sim, event["eventId"]) == "Scheduled"  # nothing started


def test_unknown_event_id_is_400_and_nothing_starts(sim: ImdsSimulator) -> None:
    event = sim.add_event(eventType="Reboot", noticeSeconds=HOUR)
    response = sim.approve([event["eventId"], "00000000-0000-0000-0000-000000000000"])
    assert response.status_code == 400
    assert "00000000-0000-0000-0000-000000000000" in response.json()["error"]
    assert _status(sim, event["eventId"]) == "Scheduled"  # all or nothing
    other = sim.add_event(eventType="Reboot", resources=["vm1"], noticeSeconds=HOUR)
    assert sim.approve([other["eventId"]], vm="vm0").status_code == 400  # not in vm0's document


def test_the_2017_03_01_preview_body_with_document_incarnation_is_accepted(sim: ImdsSimulator) -> None:
    event = sim.add_event(eventType="Reboot", noticeSeconds=HOUR)
    body = {"DocumentIncarnation": "2", "StartRequests": [{"EventId": event["eventId"]}]}
    response = sim.metadata("POST", SE, api_version="2017-03-01", data=json.dumps(body))
    assert response.status_code == 200
    assert _status(sim, event["eventId"]) == "Started"


def test_event_starts_when_not_before_passes_then_disappears(sim: ImdsSimulator) -> None:
    event = sim.add_event(eventType="Freeze", noticeSeconds=300, startedSeconds=600)  # 0.5 s, then 1 s
    seen = [sim.scheduled_events()]
    assert seen[0]["Events"][0]["EventStatus"] == "Scheduled"
    started = wait_for(lambda: [d for d in [sim.scheduled_events()] if d["Events"]
                                and d["Events"][0]["EventStatus"] == "Started"], timeout=15)[0]
    assert started["Events"][0]["NotBefore"] == ""
    assert started["DocumentIncarnation"] == seen[0]["DocumentIncarnation"] + 1
    gone = wait_for(lambda: [d for d in [sim.scheduled_events()] if not d["Events"]], timeout=15)[0]
    assert gone["DocumentIncarnation"] == started["DocumentIncarnation"] + 1
    assert sim.event(event["eventId"])["state"] == "Completed"


def test_transitions_nobody_polled_still_each_bump_the_incarnation(sim: ImdsSimulator) -> None:
    """The background clock applies each step in order: Scheduled, Started, gone = three changes."""
    before = sim.scheduled_events()["DocumentIncarnation"]
    event = sim.add_event(eventType="Preempt", startedSeconds=60)  # 30 s notice: 0.05 s; gone 0.1 s later
    wait_for(lambda: sim.event(event["eventId"])["state"] == "Completed", timeout=15)
    assert sim.scheduled_events() == {"DocumentIncarnation": before + 3, "Events": []}


def test_cancelled_event_vanishes_without_starting(sim: ImdsSimulator) -> None:
    event = sim.add_event(eventType="Redeploy", noticeSeconds=HOUR)
    incarnation = sim.scheduled_events()["DocumentIncarnation"]
    cancelled = sim.cancel(event["eventId"])
    assert cancelled["state"] == "Cancelled" and cancelled["startedAt"] is None
    assert sim.scheduled_events() == {"DocumentIncarnation": incarnation + 1, "Events": []}
    assert sim.approve([event["eventId"]]).status_code == 200  # a late approval of a known id: no-op
    assert sim.event(event["eventId"])["state"] == "Cancelled"
    assert sim.session.post(f"{sim.base_url}/admin/events/{event['eventId']}/cancel").status_code == 409
    assert sim.session.post(f"{sim.base_url}/admin/events/nope/cancel").status_code == 404


def test_started_without_scheduled(sim: ImdsSimulator) -> None:
    """Host hardware failure: a Reboot appears directly as Started, then goes."""
    event = sim.add_event(eventType="Reboot", status="Started", startedSeconds=600)
    first = _events(sim)
    assert first == [] or (first[0]["EventStatus"], first[0]["NotBefore"]) == ("Started", "")
    wait_for(lambda: sim.event(event["eventId"])["state"] == "Completed", timeout=15)
    assert _events(sim) == []
    assert not any(r["body"] for r in sim.requests(method="POST"))  # nobody approved it


def test_shared_event_appears_identically_and_one_approval_starts_it_for_all(sim: ImdsSimulator) -> None:
    vm2_before = sim.scheduled_events("vm2")
    event = sim.add_event(eventType="Freeze", resources=["vm0", "vm1"], noticeSeconds=HOUR,
                          startedSeconds=HOUR)
    doc0, doc1 = sim.scheduled_events("vm0"), sim.scheduled_events("vm1")
    assert doc0 == doc1 and doc0["Events"][0]["EventId"] == event["eventId"]
    assert doc0["Events"][0]["Resources"] == ["vm0", "vm1"]
    assert sim.scheduled_events("vm2") == vm2_before  # not in the audience: unchanged
    assert sim.approve([event["eventId"]], vm="vm1").status_code == 200
    after0, after1 = sim.scheduled_events("vm0"), sim.scheduled_events("vm1")
    assert after0 == after1 and after0["Events"][0]["EventStatus"] == "Started"
    assert after0["DocumentIncarnation"] == doc0["DocumentIncarnation"] + 1


def test_audience_may_differ_from_resources(sim: ImdsSimulator) -> None:
    """An availability-set event lists the affected VMs but reaches every VM of the set."""
    sim.add_event(eventType="Reboot", resources=["vm0"], audience=["vm0", "vm1", "vm2"], noticeSeconds=HOUR)
    docs = [sim.scheduled_events(vm) for vm in ("vm0", "vm1", "vm2")]
    assert docs[0] == docs[1] == docs[2] and docs[0]["Events"][0]["Resources"] == ["vm0"]


def test_concurrent_approvals_are_applied_once(sim: ImdsSimulator) -> None:
    event = sim.add_event(eventType="Freeze", resources=["vm0", "vm1", "vm2"], noticeSeconds=HOUR,
                          startedSeconds=HOUR)
    before = sim.scheduled_events("vm2")["DocumentIncarnation"]
    statuses: List[int] = []
    lock = threading.Lock()

    def approve(vm: str) -> None:
        client = ImdsSimulator(sim.base_url)
        codes = [client.approve([event["eventId"]], vm=vm).status_code for _ in range(5)]
        client.close()
        with lock:
            statuses.extend(codes)

    threads = [threading.Thread(target=approve, args=(vm,)) for vm in ("vm0", "vm1", "vm2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert statuses == [200] * 15
    assert sim.scheduled_events("vm2")["DocumentIncarnation"] == before + 1
    assert len(sim.event(event["eventId"])["approvedBy"]) == 15


def test_default_notice_and_duration_follow_the_reference(sim: ImdsSimulator) -> None:
    expected = {"Freeze": (900, 5), "Reboot": (900, -1), "Redeploy": (600, -1), "Preempt": (30, -1),
                "Terminate": (300, -1)}
    for kind, (notice, duration) in expected.items():
        event = sim.add_event(eventType=kind)
        assert (event["noticeSeconds"], event["durationInSeconds"]) == (notice, duration), kind
        assert event["eventSource"] == "Platform" and event["resources"] == ["vm0"]


@pytest.mark.parametrize("spec,status", [
    ({"eventType": "Explode"}, 400), ({}, 400), ({"eventType": "Freeze", "eventSource": "Admin"}, 400),
    ({"eventType": "Freeze", "audience": ["nope"]}, 400), ({"eventType": "Freeze", "resources": "vm0"}, 400),
    ({"eventType": "Freeze", "durationInSeconds": -2}, 400),
    ({"eventType": "Freeze", "noticeSeconds": -1}, 400),
    ({"eventType": "Freeze", "status": "Completed"}, 400),
    ({"eventType": "Freeze", "description": "x" * 5000}, 400),
    ({"eventType": "Freeze", "resources": ["vm0", ""]}, 400),
])
def test_admin_rejects_bad_event_requests_with_a_message(sim: ImdsSimulator, spec: Dict[str, Any],
                                                         status: int) -> None:
    response = sim.session.post(f"{sim.base_url}/admin/events", json=spec)
    assert response.status_code == status and response.json()["error"]
    assert sim.events() == []


def test_duplicate_event_id_is_409(sim: ImdsSimulator) -> None:
    sim.add_event(eventType="Freeze", eventId="E-1", noticeSeconds=HOUR)
    assert sim.session.post(f"{sim.base_url}/admin/events",
                            json={"eventType": "Reboot", "eventId": "E-1"}).status_code == 409
