"""IMDS simulator conformance, faults and the request log: status bursts, slow calls (and the slow
first call), malformed and schema-invalid bodies, an incarnation reset, per-VM and per-path scope."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import requests

import schemas
from sandbox import processes
from sandbox.imds.client import ImdsSimulator
from tests.sandbox.simulator import running

SE = "/metadata/scheduledevents"
COMPUTE = "/metadata/instance/compute"
HOUR = 3600


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImdsSimulator]:
    yield from running(["--time-scale", "600", "--rate-limit", "0", "--vm", "vm0", "--vm", "vm1"],
                       tmp_path_factory.mktemp("imds"))


@pytest.fixture(autouse=True)
def _fresh(sim: ImdsSimulator) -> None:
    sim.reset()


@pytest.mark.parametrize("status", [500, 410, 429, 404])
def test_status_fault_answers_the_next_n_requests_then_recovers(sim: ImdsSimulator, status: int) -> None:
    sim.fault(kind="status", status=status, count=3)
    assert [sim.metadata("GET", SE).status_code for _ in range(4)] == [status] * 3 + [200]


def test_fault_scope_by_vm_and_path(sim: ImdsSimulator) -> None:
    sim.fault(kind="status", status=500, vm="vm1", count=1)
    assert sim.metadata("GET", SE, vm="vm0").status_code == 200
    assert sim.metadata("GET", COMPUTE, vm="vm1", api_version="2021-02-01").status_code == 200
    assert sim.metadata("GET", SE, vm="vm1").status_code == 500
    sim.fault(kind="status", status=503, path="compute")
    assert sim.metadata("GET", SE).status_code == 200
    assert sim.metadata("GET", COMPUTE, api_version="2021-02-01").status_code == 503
    sim.fault(kind="status", status=500, path="any", count=2)
    assert sim.metadata("GET", "/metadata/identity/oauth2/token", api_version="2018-02-01",
                        params={"resource": "x"}).status_code == 500
    assert sim.metadata("GET", SE).status_code == 500
    assert sim.metadata("GET", SE).status_code == 200


def test_faults_can_be_listed_and_cleared(sim: ImdsSimulator) -> None:
    sim.fault(kind="status", status=500, count=5)
    assert sim.admin("GET", "/faults")[0]["count"] == 5
    sim.clear_faults()
    assert sim.admin("GET", "/faults") == []
    assert sim.metadata("GET", SE).status_code == 200


def test_slow_fault_delays_the_next_requests(sim: ImdsSimulator) -> None:
    sim.fault(kind="slow", seconds=3, count=1)
    with pytest.raises(requests.exceptions.ReadTimeout):
        sim.metadata("GET", SE, timeout=0.5)
    assert sim.metadata("GET", SE, timeout=5).status_code == 200  # only the next one was slow


def test_first_call_delay_flag_delays_each_vms_first_request(tmp_path: Path) -> None:
    server = processes.start_imds(["--first-call-delay", "3", "--vm", "vm0", "--vm", "vm1"], log_dir=tmp_path)
    try:
        sim = ImdsSimulator(f"http://{processes.LOOPBACK}:{server.port}")
        with pytest.raises(requests.exceptions.ReadTimeout):
            sim.metadata("GET", SE, timeout=0.5)
        with pytest.raises(requests.exceptions.ReadTimeout):
            sim.metadata("GET", SE, vm="vm1", timeout=0.5)
        assert sim.metadata("GET", SE, timeout=5).status_code == 200
        sim.close()
    finally:
        server.stop()


def test_malformed_fault_returns_200_with_broken_json(sim: ImdsSimulator) -> None:
    sim.add_event(eventType="Freeze", noticeSeconds=HOUR)
    sim.fault(kind="malformed")
    response = sim.metadata("GET", SE)
    assert response.status_code == 200
    with pytest.raises(ValueError):
        json.loads(response.text)
    assert sim.metadata("GET", SE).json()["Events"]  # next one is fine


def test_invalid_fault_returns_200_with_a_schema_invalid_document(sim: ImdsSimulator) -> None:
    sim.fault(kind="invalid")
    response = sim.metadata("GET", SE)
    assert response.status_code == 200
    assert schemas.errors("imds-scheduled-events.schema.json", response.json())
    assert schemas.errors("imds-scheduled-events.schema.json", sim.scheduled_events()) == []


def test_reset_fault_drops_the_incarnation_keeping_the_content(sim: ImdsSimulator) -> None:
    for _ in range(3):
        sim.add_event(eventType="Reboot", noticeSeconds=HOUR)
    before = sim.scheduled_events()
    assert before["DocumentIncarnation"] == 4
    answer = sim.fault(kind="reset", vm="vm0")
    after = sim.scheduled_events()
    assert after["DocumentIncarnation"] == answer["incarnations"]["vm0"] < before["DocumentIncarnation"]
    assert after["Events"] == before["Events"]
    sim.add_event(eventType="Freeze", noticeSeconds=HOUR)  # counting goes on from the lower number
    assert sim.scheduled_events()["DocumentIncarnation"] == after["DocumentIncarnation"] + 1
    assert sim.scheduled_events("vm1")["DocumentIncarnation"] == 1  # other VM untouched


@pytest.mark.parametrize("spec", [{"kind": "explode"}, {"kind": "status", "status": 200},
                                  {"kind": "slow"}, {"kind": "status", "count": 0},
                                  {"kind": "status", "vm": "nope"}, {"kind": "status", "path": "x"}])
def test_bad_fault_requests_are_400(sim: ImdsSimulator, spec: dict) -> None:
    response = sim.session.post(f"{sim.base_url}/admin/faults", json=spec)
    assert response.status_code == 400 and response.json()["error"]


def test_request_log_records_approvals_and_filters(sim: ImdsSimulator) -> None:
    event = sim.add_event(eventType="Reboot", resources=["vm0", "vm1"], noticeSeconds=HOUR)
    sim.metadata("GET", SE, vm="vm0")
    sim.approve([event["eventId"]], vm="vm1")
    sim.metadata("GET", SE, vm="vm0", headers={"Metadata": "false"})
    posts = sim.requests(method="POST", path="scheduledevents")
    assert len(posts) == 1
    assert posts[0]["vm"] == "vm1" and posts[0]["status"] == 200
    assert json.loads(posts[0]["body"]) == {"StartRequests": [{"EventId": event["eventId"]}]}
    assert posts[0]["query"] == {"api-version": "2020-07-01"}
    vm0 = sim.requests(vm="vm0")
    assert [r["status"] for r in vm0] == [200, 400]
    assert vm0[1]["headers"]["Metadata"] == "false"
    assert vm0[0]["t"] <= vm0[1]["t"]
    sim.admin("DELETE", "/requests")
    assert sim.requests() == []


def test_admin_reset_restores_the_start_state(sim: ImdsSimulator) -> None:
    sim.add_event(eventType="Freeze")
    sim.add_vm(name="extra")
    sim.fault(kind="status", count=5)
    sim.reset()
    assert sim.events() == [] and sim.admin("GET", "/faults") == [] and sim.requests() == []
    assert [vm["name"] for vm in sim.admin("GET", "/vms")] == ["vm0", "vm1"]
    assert sim.scheduled_events() == {"DocumentIncarnation": 1, "Events": []}


def test_health(sim: ImdsSimulator) -> None:
    health = sim.admin("GET", "/health")
    assert health["status"] == "ok" and health["vms"] == ["vm0", "vm1"] and health["timeScale"] == 600
