"""`se-fleet coverage` (issue 48, items 2 and 3) end to end: the real azure-mgmt-resourcegraph SDK over real
HTTP against the Resource Graph stand-in (sandbox/inventory_graph.py: the documented response shape,
$skipToken paging) with VMs of every kind, joined with a real central (the Functions runner running
function_app.py on Azurite) through GET /api/fleet. The ARM token comes from the IMDS simulator's
managed-identity endpoint (azure-identity, through AZURE_POD_IDENTITY_AUTHORITY_HOST): no Azure.
The policy's deployment is played by the test: the forwarder's extension appears in Resource Graph, then the
VM's forwarder is heard by central."""

from __future__ import annotations

import io
import json
from datetime import datetime, timezone
from typing import Any, Dict, Tuple

import pytest

from central.cli import se_fleet as fleet_cli
from central.runtime import coverage_read
from sandbox import processes
from tests.central.factory import body

from .coverage_world import BULK, CENTRAL, LATE, SUB, admin, extension_row, vm_row, world


@pytest.fixture(scope="module")
def env(coverage_env: Dict[str, Any]) -> Dict[str, Any]:
    return coverage_env


def coverage(env: Dict[str, Any], *scope: str) -> Tuple[int, str]:
    out = io.StringIO()
    code = fleet_cli.main(["coverage", *scope, "--url", env["url"], "--token", env["token"],
                           "--central-principal-id", CENTRAL], out=out)
    return code, out.getvalue()


def verdicts(text: str) -> Dict[str, str]:
    return {m["name"]: m["verdict"] for m in json.loads(text)["machines"]}


def test_a_subscription_every_kind_of_vm_paged(env: Dict[str, Any]) -> None:
    admin(env, "world", world())
    calls_before = len(admin(env, "calls"))
    code, text = coverage(env, "--subscription", SUB, "--json")
    assert code == 1  # `nothing` is blind
    found = verdicts(text)
    assert {k: v for k, v in found.items() if not k.startswith("bulk-")} == {
        "heard": "agent", "quiet": "silent agent", "nothing": "blind", "opted": "agentless",
        "off": "excluded", "web_0": "agent", "web_1": "silent agent"}
    assert sum(1 for k, v in found.items() if k.startswith("bulk-") and v == "agentless") == BULK
    report = json.loads(text)
    assert report["byVerdict"] == {"agent": 2, "agentless": BULK + 1, "silent agent": 2, "blind": 1,
                                   "excluded": 1}
    assert [(g["resourceGroup"], g["agentless"]) for g in report["byResourceGroup"]] == [("apps", 1),
                                                                                        ("bulk", BULK)]
    inventory = [c for c in admin(env, "calls")[calls_before:] if c["query"].startswith("resources")
                 and c["userAgent"] != coverage_read.USER_AGENT]  # not central's own read (its fleet view)
    tokens = [(c.get("options") or {}).get("$skipToken") for c in inventory]
    assert len(inventory) == 3 and tokens[0] is None and all(tokens[1:])  # paged by $skipToken
    assert all(c["subscriptions"] == [SUB] for c in inventory)


def test_the_table_counts_by_resource_group(env: Dict[str, Any]) -> None:
    admin(env, "world", world())
    code, text = coverage(env, "--subscription", SUB, "--resource-group", "apps")
    assert code == 1
    lines = text.splitlines()
    assert lines[1].split()[0] == "nothing" and "BLIND" in lines[1]
    assert f"{SUB}/apps: 2 agent, 1 agentless, 2 silent agent, 1 blind, 1 excluded" in lines
    assert lines[-1] == "7 VM(s): 2 agent, 1 agentless, 2 silent agent, 1 blind, 1 excluded"


def test_a_vm_created_after_the_assignment_is_blind_until_the_policy_covers_it(
        env: Dict[str, Any]) -> None:
    late = (vm_row("late-1", LATE.vm_id, group="late"),
            vm_row("late-off", "6f1e2d3c-0000-4000-8000-00000000000f", group="late",
                   tags={"se-forwarder": "off"}))
    admin(env, "world", world(late))
    code, text = coverage(env, "--subscription", SUB, "--resource-group", "late", "--json")
    assert (code, verdicts(text)) == (1, {"late-1": "blind", "late-off": "excluded"})
    # The policy's DeployIfNotExists runs: the extension is there, the forwarder not heard yet.
    admin(env, "world", world((*late, extension_row("late-1", "late"))))
    code, text = coverage(env, "--subscription", SUB, "--resource-group", "late", "--json")
    assert (code, verdicts(text)) == (0, {"late-1": "silent agent", "late-off": "excluded"})
    # The forwarder starts and central hears it.
    now = datetime.now(timezone.utc)
    env["svc"].handle_batch([body(LATE.heartbeat(at=now))], now=now)
    code, text = coverage(env, "--subscription", SUB, "--resource-group", "late", "--json")
    assert (code, verdicts(text)) == (0, {"late-1": "agent", "late-off": "excluded"})


def test_a_management_group(env: Dict[str, Any]) -> None:
    admin(env, "world", world())
    code, text = coverage(env, "--management-group", "mg-b", "--json")
    assert (code, verdicts(text)) == (1, {"far": "blind"})
    mine = [c for c in admin(env, "calls") if c["userAgent"] != coverage_read.USER_AGENT]
    assert mine[-1]["managementGroups"] == ["mg-b"]


def test_errors_are_one_line_with_their_exit_codes(env: Dict[str, Any],
                                                   capsys: pytest.CaptureFixture) -> None:
    admin(env, "world", world())
    unknown = "00000000-1111-2222-3333-444444444444"
    assert coverage(env, "--subscription", unknown)[0] == 5
    assert "AuthorizationFailed" in capsys.readouterr().err
    assert coverage(env, "--resource-group", "apps")[0] == 3
    assert coverage(env, "--subscription", SUB, "--resource-group", 'a" or 1==1')[0] == 3
    closed = f"http://127.0.0.1:{processes.free_port()}"
    out = io.StringIO()
    args = ["coverage", "--subscription", SUB, "--token", env["token"]]
    assert fleet_cli.main([*args, "--url", closed], out=out) == 4
    assert "is not reachable" in capsys.readouterr().err.strip().splitlines()[-1]
    assert fleet_cli.main([*args, "--url", env["url"], "--resource-graph-endpoint", closed], out=out) == 4
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("se-fleet: cannot reach Resource Graph")
    assert fleet_cli.main([*args, "--url", env["url"], "--token", "not.a.token"], out=out) == 4
