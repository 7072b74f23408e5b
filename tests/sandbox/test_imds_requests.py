"""IMDS simulator conformance, request rules: header, api-version, proxies, paths, methods, rate
limit, instance metadata and the token endpoint. One test per rule, over real HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from sandbox import processes
from sandbox.imds.client import ImdsSimulator
from sandbox.imds.identity import from_spec
from tests.sandbox.simulator import running

VERSIONS = ["2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01"]
SE = "/metadata/scheduledevents"
SCALESET_VM = {"name": "web_3", "vmScaleSetName": "web", "zone": "2", "platformUpdateDomain": "4",
               "platformFaultDomain": "1", "placementGroupId": "pg-7", "priority": "Spot",
               "evictionPolicy": "Delete", "osType": "Windows", "tags": {"role": "web", "env": "prod"}}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImdsSimulator]:
    """No rate limit here (its own test below): these tests make many quick requests."""
    yield from running(["--rate-limit", "0", "--vm", "vm0", "--vm", json.dumps(SCALESET_VM)],
                       tmp_path_factory.mktemp("imds"))


@pytest.fixture(autouse=True)
def _fresh(request: pytest.FixtureRequest) -> None:
    if "sim" in request.fixturenames:
        request.getfixturevalue("sim").reset()


def test_metadata_header_is_required(sim: ImdsSimulator) -> None:
    missing = sim.session.get(f"{sim.base_url}{SE}", params={"api-version": "2020-07-01"})
    wrong = sim.metadata("GET", SE, headers={"Metadata": "false"})
    assert (missing.status_code, wrong.status_code) == (400, 400)
    assert "metadata header" in missing.json()["error"].lower()
    assert sim.metadata("GET", SE).status_code == 200


@pytest.mark.parametrize("version", [None, "", "latest", "2018-01-01", "2021-02-01"])
def test_api_version_required_and_known_else_400_listing_the_valid_ones(sim: ImdsSimulator,
                                                                       version: str | None) -> None:
    response = sim.metadata("GET", SE, api_version=version)
    assert response.status_code == 400
    assert response.json()["valid-versions"] == VERSIONS
    assert response.json()["newest-versions"][0] == "2020-07-01"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_documented_api_version_is_served(sim: ImdsSimulator, version: str) -> None:
    response = sim.metadata("GET", SE, api_version=version)
    assert response.status_code == 200
    assert response.json() == {"DocumentIncarnation": 1, "Events": []}


def test_x_forwarded_for_is_rejected(sim: ImdsSimulator) -> None:
    response = sim.metadata("GET", SE, headers={"X-Forwarded-For": "10.0.0.1"})
    assert response.status_code == 400
    assert "X-Forwarded-For" in response.json()["error"]


@pytest.mark.parametrize("path", ["/metadata/nothing", "/metadata/scheduledevents/x", "/other",
                                  "/vms/no-such-vm/metadata/scheduledevents"])
def test_unknown_path_is_404(sim: ImdsSimulator, path: str) -> None:
    assert sim.metadata("GET", path).status_code == 404


@pytest.mark.parametrize("method,path", [("PUT", SE), ("DELETE", SE), ("PATCH", SE),
                                         ("POST", "/metadata/instance/compute"),
                                         ("POST", "/metadata/identity/oauth2/token")])
def test_wrong_method_is_405(sim: ImdsSimulator, method: str, path: str) -> None:
    response = sim.metadata(method, path, data=b"{}")
    assert response.status_code == 405
    assert "GET" in response.headers["Allow"]


def test_instance_compute_serves_the_configured_identity(sim: ImdsSimulator) -> None:
    response = sim.metadata("GET", "/metadata/instance/compute", vm="web_3", api_version="2021-02-01")
    assert response.status_code == 200
    compute = response.json()
    for key in ("vmScaleSetName", "zone", "platformUpdateDomain", "platformFaultDomain", "placementGroupId",
                "priority", "evictionPolicy", "osType"):
        assert compute[key] == SCALESET_VM[key], key
    assert compute["name"] == "web_3"
    assert compute["tags"] == "role:web;env:prod"
    assert compute["tagsList"] == [{"name": "role", "value": "web"}, {"name": "env", "value": "prod"}]
    assert compute["resourceId"].endswith("/virtualMachineScaleSets/web/virtualMachines/3")
    assert compute["resourceId"].startswith(f"/subscriptions/{compute['subscriptionId']}/resourceGroups/"
                                            f"{compute['resourceGroupName']}/")
    assert compute["location"]


def test_identity_defaults_derive_from_the_name(sim: ImdsSimulator) -> None:
    compute = sim.metadata("GET", "/metadata/instance/compute", api_version="2021-02-01").json()  # first VM
    assert compute["name"] == "vm0"
    assert compute["vmId"] == from_spec({"name": "vm0"}).vmId  # stable across runs
    assert compute["resourceId"].endswith("/providers/Microsoft.Compute/virtualMachines/vm0")
    assert compute["tagsList"] == [] and compute["tags"] == ""
    other = sim.metadata("GET", "/metadata/instance/compute", vm="web_3", api_version="2021-02-01").json()
    assert other["vmId"] != compute["vmId"]


def test_instance_api_version_is_required(sim: ImdsSimulator) -> None:
    assert sim.metadata("GET", "/metadata/instance/compute", api_version=None).status_code == 400
    assert sim.metadata("GET", "/metadata/instance/compute", api_version="1999-01-01").status_code == 400


def test_admin_adds_a_vm_served_under_its_prefix(sim: ImdsSimulator) -> None:
    created = sim.add_vm(name="vm9", vmId="11111111-2222-3333-4444-555555555555", tags={"k": "v"})
    assert created["vmId"] == "11111111-2222-3333-4444-555555555555"
    compute = sim.metadata("GET", "/metadata/instance/compute", vm="vm9", api_version="2021-02-01").json()
    assert compute == created
    assert sim.metadata("GET", SE, vm="vm9").json() == {"DocumentIncarnation": 1, "Events": []}
    duplicate = sim.session.post(f"{sim.base_url}/admin/vms", json={"name": "vm9"})
    assert duplicate.status_code == 409
    assert sim.session.post(f"{sim.base_url}/admin/vms", json={"vmId": "x"}).status_code == 400


def test_token_endpoint_answers_a_fake_token(sim: ImdsSimulator) -> None:
    response = sim.metadata("GET", "/metadata/identity/oauth2/token", api_version="2018-02-01",
                            params={"resource": "https://eventhubs.azure.net"})
    assert response.status_code == 200
    token = response.json()
    assert token["token_type"] == "Bearer" and token["access_token"]
    assert token["resource"] == "https://eventhubs.azure.net"
    assert int(token["expires_on"]) > int(token["not_before"])
    assert token["expires_in"] == "86399"  # as Entra ID's managed-identity tokens, unless --token-lifetime
    no_resource = sim.metadata("GET", "/metadata/identity/oauth2/token", api_version="2018-02-01")
    assert no_resource.status_code == 400


def test_token_lifetime_is_configurable_for_a_sped_up_soak(tmp_path: Path) -> None:
    server = processes.start_imds(["--token-lifetime", "720"], log_dir=tmp_path)
    try:
        sim = ImdsSimulator(f"http://{processes.LOOPBACK}:{server.port}")
        token = sim.metadata("GET", "/metadata/identity/oauth2/token", api_version="2018-02-01",
                             params={"resource": "https://eventhubs.azure.net"}).json()
        sim.close()
    finally:
        server.stop()
    assert token["expires_in"] == token["ext_expires_in"] == "720"
    assert int(token["expires_on"]) - int(token["not_before"]) == 720


def test_rate_limit_429_over_five_requests_per_window_token_calls_included(tmp_path: Path) -> None:
    # A 30 s window makes the count deterministic; the default is 5 per sliding 1 s.
    server = processes.start_imds(["--rate-window", "30", "--vm", "vm0", "--vm", "vm1"], log_dir=tmp_path)
    try:
        sim = ImdsSimulator(f"http://{processes.LOOPBACK}:{server.port}")
        token = {"resource": "https://management.azure.com/"}
        statuses = [sim.metadata("GET", "/metadata/identity/oauth2/token", api_version="2018-02-01",
                                 params=token).status_code for _ in range(3)]
        statuses += [sim.metadata("GET", SE).status_code for _ in range(2)]
        assert statuses == [200] * 5
        assert sim.metadata("GET", SE).status_code == 429
        assert sim.metadata("GET", "/metadata/identity/oauth2/token", api_version="2018-02-01",
                            params=token).status_code == 429
        assert sim.metadata("GET", SE, vm="vm1").status_code == 200  # the budget is per VM
        sim.reset()  # clears the windows too
        assert sim.metadata("GET", SE).status_code == 200
        sim.close()
    finally:
        server.stop()


def test_default_rate_window_slides(tmp_path: Path) -> None:
    """Default 5 per sliding 1 s: a burst is throttled; after a quiet second the VM is served again."""
    server = processes.start_imds(["--vm", "vm0"], log_dir=tmp_path)
    try:
        sim = ImdsSimulator(f"http://{processes.LOOPBACK}:{server.port}")
        burst = [sim.metadata("GET", SE).status_code for _ in range(30)]  # loopback: far above 5/s
        assert 429 in burst and burst[:1] == [200]
        time.sleep(1.1)  # the window has emptied: not a timing assertion, a precondition
        assert sim.metadata("GET", SE).status_code == 200
        sim.close()
    finally:
        server.stop()


def test_etag_and_if_none_match_give_304_while_unchanged(sim: ImdsSimulator) -> None:
    first = sim.metadata("GET", SE)
    etag = first.headers["ETag"]
    assert sim.metadata("GET", SE, headers={"If-None-Match": etag}).status_code == 304
    sim.add_event(eventType="Reboot")
    changed = sim.metadata("GET", SE, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["ETag"] != etag


def test_cli_help_lists_every_flag() -> None:
    result = subprocess.run([sys.executable, "-m", "sandbox.imds", "--help"], capture_output=True, text=True,
                            timeout=30, cwd=processes.REPO)
    assert result.returncode == 0
    for flag in ("--port", "--host", "--time-scale", "--vm", "--rate-limit", "--rate-window",
                 "--first-call-delay", "--verbose"):
        assert flag in result.stdout


def test_cli_rejects_a_bad_vm_spec() -> None:
    result = subprocess.run([sys.executable, "-m", "sandbox.imds", "--vm", '{"vmId": "no-name"}'],
                            capture_output=True, text=True, timeout=30, cwd=processes.REPO)
    assert result.returncode == 2 and "name" in result.stderr



def test_a_bad_content_length_is_400_and_the_server_keeps_serving(sim: ImdsSimulator) -> None:
    host, port = sim.base_url.rsplit("/", 1)[-1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"POST /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\n"
                     b"Metadata: true\r\nContent-Length: abc\r\n\r\n")
        assert conn.recv(4096).startswith(b"HTTP/1.1 400")
    assert sim.metadata("GET", SE).status_code == 200
