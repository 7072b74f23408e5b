"""Issue 23, point 3 (client) and point 6 (stand-in): central's ARM acknowledge client (central.runtime.arm,
plain REST with an azure-identity token) against the IMDS simulator's ARM stand-in over real HTTP. The token
comes from the simulator's managed-identity endpoint through azure-identity's ManagedIdentityCredential;
an ARM approval starts the event in the fabric exactly as the VM's own IMDS POST does."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest
import requests

from central.model.owner import Owner as Target
from central.runtime.arm import Ack, ArmAcknowledger, read
from sandbox import processes
from sandbox.imds.identity import DEFAULT_RESOURCE_GROUP, DEFAULT_SUBSCRIPTION

UNI = json.dumps({"name": "uni_0", "vmScaleSetName": "uni"})


@pytest.fixture
def imds(tmp_path: Path) -> Iterator[processes.Server]:
    server = processes.start_imds(["--vm", "web_0", "--vm", UNI, "--rate-limit", "0"], log_dir=tmp_path)
    yield server
    server.stop()


@pytest.fixture
def arm(imds: processes.Server, monkeypatch: pytest.MonkeyPatch) -> ArmAcknowledger:
    from azure.identity import ManagedIdentityCredential

    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://127.0.0.1:{imds.port}")
    session = requests.Session()
    session.trust_env = False
    return ArmAcknowledger(ManagedIdentityCredential(), f"http://127.0.0.1:{imds.port}", session=session,
                           max_wait=2.0)


def admin(imds: processes.Server, path: str, body: Optional[Dict[str, Any]] = None,
          method: str = "POST") -> Any:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(f"http://127.0.0.1:{imds.port}/admin/{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def target(kind: str, name: str) -> Target:
    return Target(DEFAULT_SUBSCRIPTION, DEFAULT_RESOURCE_GROUP, kind, name)


def test_an_arm_approval_starts_the_event_as_an_imds_post_does(imds: processes.Server,
                                                                arm: ArmAcknowledger) -> None:
    admin(imds, "events", {"eventType": "Reboot", "resources": ["web_0"], "eventId": "A-1"})
    (ack,) = arm.acknowledge(target("virtualMachines", "web_0"), ["A-1"])
    assert ack == Ack("A-1", True, 200, "", "Successfully Approved")
    event = admin(imds, "events/A-1", method="GET")
    assert event["state"] == "Started" and event["approvedBy"] == ["web_0"]
    # the VM's own approval afterwards changes nothing: one effective approval, whichever path came first
    request = urllib.request.Request(f"http://127.0.0.1:{imds.port}/vms/web_0/metadata/scheduledevents"
                                     "?api-version=2020-07-01", method="POST", headers={"Metadata": "true"},
                                     data=json.dumps({"StartRequests": [{"EventId": "A-1"}]}).encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert admin(imds, "events/A-1", method="GET")["state"] == "Started"


def test_the_list_call_s_207_gives_each_event_its_own_result(imds: processes.Server,
                                                              arm: ArmAcknowledger) -> None:
    admin(imds, "events", {"eventType": "Freeze", "resources": ["uni_0"], "eventId": "U-1"})
    acks = arm.acknowledge(target("virtualMachineScaleSets", "uni"), ["U-1", "NO-SUCH"])
    assert [(a.event_id, a.ok, a.status, a.code) for a in acks] == [("U-1", True, 207, ""),
                                                                     ("NO-SUCH", False, 207, "NotFound")]
    assert admin(imds, "events/U-1", method="GET")["state"] == "Started"


def test_only_the_owner_acknowledges(imds: processes.Server, arm: ArmAcknowledger) -> None:
    admin(imds, "events", {"eventType": "Freeze", "resources": ["uni_0"], "eventId": "U-2"})
    (ack,) = arm.acknowledge(target("virtualMachines", "uni_0"), ["U-2"])  # a scale set's instance
    assert (ack.ok, ack.status, ack.code) == (False, 404, "NotFound")
    assert admin(imds, "events/U-2", method="GET")["state"] == "Scheduled"


def test_a_call_without_an_arm_token_is_refused(imds: processes.Server) -> None:
    admin(imds, "events", {"eventType": "Reboot", "resources": ["web_0"], "eventId": "A-2"})
    url = (f"http://127.0.0.1:{imds.port}{target('virtualMachines', 'web_0').path()}/A-2/acknowledge"
           "?api-version=2025-11-01")
    session = requests.Session()
    session.trust_env = False
    assert session.post(url, timeout=10).status_code == 401
    assert session.post(url, headers={"Authorization": "Bearer not-a-jwt"}, timeout=10).status_code == 401
    assert admin(imds, "events/A-2", method="GET")["state"] == "Scheduled"


def test_throttling_is_honoured_then_reported(imds: processes.Server, arm: ArmAcknowledger) -> None:
    admin(imds, "events", {"eventType": "Reboot", "resources": ["web_0"], "eventId": "A-3"})
    admin(imds, "arm", {"throttle": 2, "retryAfter": 0.3})
    (ack,) = arm.acknowledge(target("virtualMachines", "web_0"), ["A-3"])  # waits 2 x 0.3 s, then approved
    assert ack.ok and admin(imds, "events/A-3", method="GET")["state"] == "Started"
    admin(imds, "events", {"eventType": "Reboot", "resources": ["web_0"], "eventId": "A-4"})
    admin(imds, "arm", {"throttle": 5, "retryAfter": 1.5})
    (ack,) = arm.acknowledge(target("virtualMachines", "web_0"), ["A-4"])  # 1.5 + 1.5 > max_wait 2
    assert (ack.ok, ack.status, ack.retry_after) == (False, 429, 1.5)


def test_the_partial_shapes_are_read() -> None:
    """Pure: the undocumented 207 (details with empty targets in request order) and the swagger's."""
    undocumented = {"response": {"code": "PartialSuccess"},
                    "details": [{"target": "", "code": "OK"},
                                {"target": "", "code": "Conflict", "message": "x"}]}
    assert [a.ok for a in read(207, undocumented, ["a", "b"])] == [True, False]
    swagger = {"error": {"code": "Partial", "details": [{"target": "b", "code": "NotFound"}]}}
    assert [a.ok for a in read(207, swagger, ["a", "b"])] == [True, False]
    denied = read(403, {"error": {"code": "AuthorizationFailed"}}, ["a"])
    assert [a.code for a in denied] == ["AuthorizationFailed"]


def test_a_partial_answer_names_events_in_any_case_and_a_throttle_inside_it_is_retried() -> None:
    """Pure: a failure whose target spells the EventId (a GUID) in the other case, or names the event's
    resource id, is that event's failure, never an approval; a per-event throttle or internal error is
    retried (the timer), not a terminal refusal."""
    from central.runtime.arm_approvals import outcome

    ids = ["C7061BAC-AFDC-4513-B24B-AA5F13A16123", "D7061BAC-AFDC-4513-B24B-AA5F13A16124"]
    lower = read(207, {"response": {}, "details": [{"target": ids[0].lower(), "code": "NotFound"}]}, ids)
    assert [a.ok for a in lower] == [False, True]
    rid = f"/subscriptions/s/resourceGroups/g/providers/Microsoft.Maintenance/scheduledevents/{ids[1]}"
    assert [a.ok for a in read(207, {"details": [{"target": rid, "code": "Conflict"}]}, ids)] == [True, False]
    throttled = read(207, {"details": [{"target": ids[0], "code": "TooManyRequests"}]}, ids[:1], 20.0)
    assert [(outcome(a), a.retry_after) for a in throttled] == [("retry", 20.0)]
    failing = read(207, {"details": [{"target": ids[0], "code": "InternalServerError"}]}, ids[:1])
    assert [outcome(a) for a in failing] == ["retry"]
    assert [outcome(a) for a in read(207, {"details": [{"target": ids[0], "code": "NotFound"}]}, ids[:1])] \
        == ["refused"]
