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
import os
import sys
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest

from central.cli import resource_graph
from central.cli import se_fleet as fleet_cli
from sandbox import processes
from sandbox.functions.issuer import LocalIssuer
from tests import signing
from tests.central.factory import Vm, body

from .conftest import RunnerFiles, central_backends, start_runner

SUB = "0b5f2a9e-6c1d-4e8f-9a7b-3c2d1e0f4a5b"
SUB_B = "5e4d3c2b-1a09-4f8e-9d7c-6b5a4f3e2d1c"
CENTRAL = "7d3c9a1e-2b4f-4c6d-8e0a-1f2b3c4d5e6f"
SEC = "/providers/Microsoft.Authorization/roleDefinitions/b67fe603-310e-4889-b9ee-8257d09d353d"
BULK = 2300  # more than two pages of 1000
HEARD, QUIET, WEB0 = Vm("heard"), Vm("quiet"), Vm("web_0", scale_set="web")
LATE = Vm("late-1")


def _rg(sub: str, group: str) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{group}/providers/Microsoft.Compute"


def vm_row(name: str, vm_id: str, group: str = "apps", sub: str = SUB, **extra: Any) -> Dict[str, Any]:
    return {"id": f"{_rg(sub, group)}/virtualMachines/{name}", "name": name,
            "type": "microsoft.compute/virtualmachines", "subscriptionId": sub, "resourceGroup": group,
            "tags": extra.pop("tags", {}), "vmId": vm_id, "owner": "", "feed": None, **extra}


def extension_row(name: str, group: str = "apps") -> Dict[str, Any]:
    return {"id": f"{_rg(SUB, group)}/virtualMachines/{name}/extensions/se-forwarder-install-linux",
            "name": "se-forwarder-install-linux", "type": "microsoft.compute/virtualmachines/extensions",
            "subscriptionId": SUB, "resourceGroup": group, "provisioningState": "Succeeded"}


def world(late: Tuple[Dict[str, Any], ...] = ()) -> Dict[str, Any]:
    resources = [
        vm_row("heard", HEARD.vm_id), extension_row("heard"),
        vm_row("quiet", QUIET.vm_id), extension_row("quiet"),
        vm_row("nothing", "6f1e2d3c-0000-4000-8000-00000000000a"),
        vm_row("opted", "6f1e2d3c-0000-4000-8000-00000000000b", feed=True),
        vm_row("off", "6f1e2d3c-0000-4000-8000-00000000000c", tags={"se-forwarder": "off"}),
        {"id": f"{_rg(SUB, 'apps')}/virtualMachineScaleSets/web", "name": "web", "subscriptionId": SUB,
         "type": "microsoft.compute/virtualmachinescalesets", "resourceGroup": "apps", "tags": {},
         "orchestrationMode": "Uniform", "extensions": [{"name": "se-forwarder-install-linux"}]},
        *[vm_row(f"bulk-{i:04d}", f"9a8b7c6d-0000-4000-8000-{i:012d}", group="bulk", feed=True)
          for i in range(BULK)],
        vm_row("far", "6f1e2d3c-0000-4000-8000-00000000000d", group="other", sub=SUB_B),
        *late,
    ]
    web = f"{_rg(SUB, 'apps')}/virtualMachineScaleSets/web"
    instances = [{"id": f"{web}/virtualMachines/{n}", "name": f"web_{n}",
                  "type": "microsoft.compute/virtualmachinescalesets/virtualmachines", "subscriptionId": SUB,
                  "resourceGroup": "apps", "tags": {}, "vmId": vm_id}
                 for n, vm_id in enumerate((WEB0.vm_id, "6f1e2d3c-0000-4000-8000-00000000000e"))]
    roles = [{"id": f"/subscriptions/{SUB}/providers/Microsoft.Authorization/roleAssignments/{n}",
              "subscriptionId": SUB, "principalId": CENTRAL, "roleDefinitionId": SEC, "scope": scope}
             for n, scope in enumerate((f"{_rg(SUB, 'apps')}/virtualMachines/opted",
                                        f"/subscriptions/{SUB}/resourceGroups/bulk"))]
    return {"resources": resources, "computeresources": instances, "authorizationresources": roles,
            "managementGroups": {"mg-b": [SUB_B]}}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    work = tmp_path_factory.mktemp("coverage")
    now = datetime.now(timezone.utc)  # the live VMs must be within the liveness window when asked
    with central_backends(work, "coverage", "coverage") as values:
        svc = signing.central(values)
        svc.handle_batch([body(QUIET.heartbeat(at=now - timedelta(hours=1)))], now=now - timedelta(hours=1))
        svc.handle_batch([body(HEARD.heartbeat(at=now)), body(WEB0.heartbeat(at=now))], now=now)
        issuer = LocalIssuer(work / "issuer").init()
        files = RunnerFiles(work / "central")
        files.write(values, keys={"host": {"default": "coverage-key"}}, auth=issuer.auth_section())
        runner = start_runner(files, "function_app")
        imds = processes.start_imds(["--rate-limit", "0"], log_dir=work)
        port = processes.free_port()
        (work / "world.json").write_text(json.dumps(world()))
        graph = processes.start("inventory-graph", [sys.executable, "-m", "sandbox.inventory_graph", "--port",
                                                   str(port), "--world", str(work / "world.json")],
                                {"http": port}, log_dir=work)
        names = ("AZURE_POD_IDENTITY_AUTHORITY_HOST", resource_graph.ENDPOINT_ENV)
        saved = {k: os.environ.get(k) for k in names}
        os.environ["AZURE_POD_IDENTITY_AUTHORITY_HOST"] = f"http://127.0.0.1:{imds.port}"
        os.environ[resource_graph.ENDPOINT_ENV] = f"http://127.0.0.1:{port}"
        try:
            yield {"svc": svc, "url": f"http://{processes.LOOPBACK}:{runner.port}", "graph": port,
                   "token": issuer.token("rita@contoso.com", ["Reader"])}
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            for server in (graph, imds, runner):
                server.stop()


def admin(env: Dict[str, Any], path: str, payload: Optional[Any] = None) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{env['graph']}/admin/{path}",
                                     method="POST" if payload is not None else "GET",
                                     data=json.dumps(payload).encode() if payload is not None else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


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
    inventory = [c for c in admin(env, "calls")[calls_before:] if c["query"].startswith("resources")]
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
    assert admin(env, "calls")[-1]["managementGroups"] == ["mg-b"]


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
