"""Issue 23, points 4 and 6: `se-policy whatif --from-resource-graph` through the real
azure-mgmt-resourcegraph SDK, over real HTTP, against the IMDS simulator's Resource Graph stand-in (rows
from the fabric, one per event in its latest state, plus fixture rows). The token comes from the simulator's
managed-identity endpoint (azure-identity, through AZURE_POD_IDENTITY_AUTHORITY_HOST): a local token
credential, no Azure.
Misconfiguration gives one line and its own exit code: no login 5, a subscription refused 5, a malformed
subscription id 3, Resource Graph unreachable 4."""

from __future__ import annotations

import io
import json
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest

from central.cli import resource_graph
from central.cli import se_policy as policy_cli
from sandbox import processes
from sandbox.imds.identity import DEFAULT_SUBSCRIPTION

WEB = [json.dumps({"name": f"web_{i}", "vmScaleSetName": "web"}) for i in range(3)]
OTHER_SUB = "11111111-2222-3333-4444-555555555555"
FIXTURE = [{"id": f"/subscriptions/{OTHER_SUB}/resourcegroups/rg-x/providers/Microsoft.Compute"
                  "/virtualMachines/x_0/providers/Microsoft.Maintenance/Scheduledevents/F-1",
            "name": "F-1", "type": "microsoft.maintenance/scheduledevents", "subscriptionId": OTHER_SUB,
            "resourceGroup": "rg-x", "location": "eastus", "zones": [],
            "properties": {"EventId": "F-1", "EventType": "Reboot", "EventStatus": "Completed",
                           "NotBefore": "", "Resources": ["x_0"], "EventSource": "Platform",
                           "DurationInSeconds": -1,
                           "Description": "captured"}}]


@pytest.fixture
def imds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[processes.Server]:
    fixture = tmp_path / "rows.json"
    fixture.write_text(json.dumps(FIXTURE), encoding="utf-8")
    args = [a for spec in WEB for a in ("--vm", spec)]
    server = processes.start_imds([*args, "--rate-limit", "0", "--resource-graph-rows", str(fixture)],
                                  log_dir=tmp_path)
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE",
                 "IDENTITY_ENDPOINT", "MSI_ENDPOINT", resource_graph.ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://127.0.0.1:{server.port}")
    yield server
    server.stop()


def admin(imds: processes.Server, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{imds.port}/admin/{path}", method="POST",
                                     data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def fleet(imds: processes.Server) -> None:
    """Two Freezes on one scale set still Scheduled, one Reboot already Started, one Redeploy cancelled."""
    admin(imds, "events", {"eventType": "Freeze", "resources": ["web_0"], "eventId": "S-1"})
    admin(imds, "events", {"eventType": "Freeze", "resources": ["web_1"], "eventId": "S-2"})
    admin(imds, "events", {"eventType": "Reboot", "resources": ["web_2"], "eventId": "R-1"})
    admin(imds, "events/R-1/start")
    admin(imds, "events", {"eventType": "Redeploy", "resources": ["web_2"], "eventId": "C-1"})
    admin(imds, "events/C-1/cancel")


def whatif(tmp_path: Path, imds_port: Optional[int], *extra: str,
           policy: str = '{"version": 1, "rules": [{"name": "all", "action": "approve"}]}') -> tuple:
    path = tmp_path / "policy.json"
    path.write_text(policy, encoding="utf-8")
    endpoint = f"http://127.0.0.1:{imds_port}" if imds_port else "http://127.0.0.1:9"
    out = io.StringIO()
    code = policy_cli.main(["whatif", str(path), "--from-resource-graph", "--since", "30d",
                            "--resource-graph-endpoint", endpoint, *extra], out=out)
    return code, out.getvalue()


def test_the_sdk_reads_every_row_through_skip_tokens_within_the_bound(imds: processes.Server) -> None:
    from azure.identity import ManagedIdentityCredential

    fleet(imds)
    endpoint = f"http://127.0.0.1:{imds.port}"
    got = resource_graph.read(ManagedIdentityCredential(), [], endpoint, max_rows=100, page_rows=2)
    assert (got.pages, got.total, got.truncated) == (3, 5, False)
    by_id = {r["name"]: r for r in got.rows}
    assert sorted(by_id) == ["C-1", "F-1", "R-1", "S-1", "S-2"]
    # updated in place: the latest status, NotBefore blank once started
    started = by_id["R-1"]["properties"]
    assert started["EventStatus"] == "Started" and started["NotBefore"] == ""
    assert by_id["C-1"]["properties"]["EventStatus"] == "Canceled"
    assert by_id["S-1"]["properties"]["NotBefore"] and "/virtualMachineScaleSets/web/" in by_id["S-1"]["id"]
    bounded = resource_graph.read(ManagedIdentityCredential(), [DEFAULT_SUBSCRIPTION], endpoint, max_rows=3,
                                  page_rows=2)
    # F-1 is another subscription's
    assert (len(bounded.rows), bounded.truncated, bounded.total) == (3, True, 4)


def test_whatif_from_resource_graph_replays_the_fleet_and_states_the_limits(imds: processes.Server,
                                                                            tmp_path: Path) -> None:
    fleet(imds)
    budget = ('{"version": 1, "budgets": {"one-per-set": {"groupBy": "scaleSet", "maxImpacted": 1}},'
              ' "rules": [{"name": "all", "action": "approve"}]}')
    code, text = whatif(tmp_path, imds.port, "--subscription", DEFAULT_SUBSCRIPTION, "--json", policy=budget)
    assert code == 0, text
    doc = json.loads(text)
    events = {e["eventId"]: e for e in doc["events"]}
    assert sorted(events) == ["C-1", "R-1", "S-1", "S-2"]  # F-1: another subscription, not asked for
    assert [events[i]["timeless"] for i in ("S-1", "S-2", "R-1", "C-1")] == [False, False, True, True]
    assert events["S-1"]["whatif"]["approvedAt"] == events["S-1"]["firstSeen"]
    assert "waiting-budget" in events["S-2"]["whatif"]["waits"]  # one per scale set: S-1 impacts web
    assert doc["read"]["statuses"] == {"Scheduled": 2, "Started": 1, "Cancelled": 1}
    assert doc["summary"]["timeless"] == 2 and "not documented" in doc["limits"]
    hold = '{"version": 1, "rules": [{"name": "x", "action": "hold"}]}'
    code, text = whatif(tmp_path, imds.port, policy=hold)
    assert code == 0
    assert "5 event(s) replayed" in text and "0 approved before NotBefore, 5 left to NotBefore" in text
    assert "Limits: Resource Graph keeps one row per event, updated in place" in text


def test_no_login_is_one_line_and_exit_5(imds: processes.Server, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://127.0.0.1:{processes.free_port()}")
    monkeypatch.setenv("PATH", str(tmp_path))  # no az, azd or pwsh to fall back on
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "az"))
    code, text = whatif(tmp_path, imds.port)
    assert code == policy_cli.whatif_cli.whatif_graph.EXIT_AZURE_ACCESS == 5
    lines = text.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("se-policy: no Azure login for Resource Graph: run `az login`")


def test_a_refused_subscription_is_exit_5_a_malformed_one_exit_3_and_no_service_exit_4(
        imds: processes.Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = whatif(tmp_path, imds.port, "--subscription", "99999999-9999-9999-9999-999999999999")
    assert code == 5 and len(text.strip().splitlines()) == 1
    assert "AuthorizationFailed" in text and "check --subscription" in text
    code, text = whatif(tmp_path, imds.port, "--subscription", "my-prod-sub")
    assert code == policy_cli.EXIT_USAGE == 3 and text == ""
    assert "is not a subscription id" in capsys.readouterr().err
    code, text = whatif(tmp_path, None)  # nothing listens on port 9
    assert code == 4 and text.startswith("se-policy: cannot reach Resource Graph at http://127.0.0.1:9")


def test_only_the_scheduled_events_query_is_answered_and_only_with_an_arm_token(
        imds: processes.Server) -> None:
    from azure.identity import ManagedIdentityCredential

    token = ManagedIdentityCredential().get_token("https://management.azure.com/.default").token
    url = f"http://127.0.0.1:{imds.port}/providers/Microsoft.ResourceGraph/resources?api-version=2021-03-01"

    def post(query: str, bearer: str = "") -> int:
        headers = {"Content-Type": "application/json"}
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        request = urllib.request.Request(url, method="POST", data=json.dumps({"query": query}).encode(),
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    answers = [post(resource_graph.QUERY), post(resource_graph.QUERY, token), post("resources", token)]
    assert answers == [401, 200, 400]
