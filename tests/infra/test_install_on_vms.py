"""infra/forwarder/install-on-vms.sh, the real script in real bash, against stand-in `az` and `azd`
executables on PATH (tests/infra/stub_cli.py) that answer from recorded outputs (tests/infra/recordings:
`azd env get-values`, `az deployment sub show` / `list` in the shapes those commands print, including
ARM's odd casing of some output names).

It must find its inputs whatever the deployment was named: from an azd environment, a named deployment,
or the newest successful deployment of the environment; and install on a VM, on every VM of a resource
group, and on Uniform and Flexible scale sets, with deployment names ARM accepts (<= 64 characters).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "forwarder" / "install-on-vms.sh"
RECORDINGS = Path(__file__).resolve().parent / "recordings"
STUB = Path(__file__).resolve().parent / "stub_cli.py"
SUB = "7b1e3c2a-59d4-4f0e-9a61-2c8d5e4f1a90"
LONG = "vm-" + "x" * 61  # 64 characters: the longest Linux VM name

if shutil.which("bash") is None:  # pragma: no cover
    pytest.skip("no bash on this machine", allow_module_level=True)


def _recording(name: str) -> Any:
    return json.loads((RECORDINGS / name).read_text())


def _vm(name: str, os_type: str = "Linux", scale_set: Optional[str] = None) -> Dict[str, Any]:
    vm: Dict[str, Any] = {
        "name": name, "resourceGroup": "my-vms", "location": "westeurope",
        "id": f"/subscriptions/{SUB}/resourceGroups/my-vms/providers/Microsoft.Compute/"
              f"virtualMachines/{name}",
        "storageProfile": {"osDisk": {"osType": os_type, "name": f"{name}_OsDisk_1"}},
        "virtualMachineScaleSet": None,
    }
    if scale_set:
        vm["virtualMachineScaleSet"] = {"id": f"/subscriptions/{SUB}/resourceGroups/MY-VMS/providers/"
                                              f"Microsoft.Compute/virtualMachineScaleSets/{scale_set}"}
    return vm


def _vmss(name: str, mode: Optional[str], os_type: str = "Linux",
          vm_ids: Tuple[str, ...] = ()) -> Dict[str, Any]:
    vmss: Dict[str, Any] = {"name": name, "resourceGroup": "my-vms", "orchestrationMode": mode,
                            "virtualMachineProfile": {"storageProfile": {"osDisk": {"osType": os_type}}},
                            "instances": [{"instanceId": str(i), "name": f"{name}_{i}", "vmId": vm_id}
                                          for i, vm_id in enumerate(vm_ids)]}
    if mode is None:
        del vmss["orchestrationMode"]  # scale sets older than the property do not report it
    return vmss


def _world(vms: List[Dict[str, Any]], sets: List[Dict[str, Any]], azd: bool) -> Dict[str, Any]:
    deployments = _recording("deployment-sub-list.json")
    entries: List[Dict[str, Any]] = [{"command": "deployment sub list", "result": deployments}]
    entries += [{"command": "deployment sub show", "options": {"--name": d["name"]}, "result": d}
                for d in deployments]
    entries.append({"command": "deployment sub show", "exit": 3,
                    "error": "(DeploymentNotFound) Deployment could not be found."})
    entries.append({"command": "vm list", "options": {"--resource-group": "my-vms"}, "result": vms})
    entries.append({"command": "vmss list", "options": {"--resource-group": "my-vms"}, "result": sets})
    entries += [{"command": "vm show", "options": {"--name": v["name"]}, "result": v} for v in vms]
    entries += [{"command": "vmss show", "options": {"--name": s["name"]}, "result": s} for s in sets]
    entries += [{"command": "vmss list-instances", "options": {"--name": s["name"]}, "result": s["instances"]}
                for s in sets]
    for command in ("vm identity assign", "vmss identity assign", "deployment group create",
                    "vmss update-instances"):
        entries.append({"command": command, "result": {}})
    world: Dict[str, Any] = {"az": entries}
    if azd:
        world["azd"] = {"default": "se-prod",
                        "envs": {"se-prod": (RECORDINGS / "azd-env-get-values.se-prod.txt").read_text()}}
    return world


class Run:
    def __init__(self, result: subprocess.CompletedProcess, log: Path) -> None:
        self.code = result.returncode
        self.out = result.stdout
        self.err = result.stderr
        self.calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def az(self, command: str) -> List[List[str]]:
        words = command.split()
        return [c[1:] for c in self.calls if c[0] == "az" and c[1:1 + len(words)] == words]

    def params(self, call: List[str]) -> Dict[str, str]:
        start = call.index("-p") + 1
        values = {}
        for item in call[start:]:
            if item.startswith("-"):
                break
            key, _, value = item.partition("=")
            values[key] = value
        return values

    def option(self, call: List[str], *names: str) -> str:
        for i, arg in enumerate(call):
            if arg in names:
                return call[i + 1]
        raise AssertionError(f"none of {names} in {call}")


@pytest.fixture
def run(tmp_path: Path):
    def _run(args: List[str], vms: Optional[List[Dict[str, Any]]] = None,
             sets: Optional[List[Dict[str, Any]]] = None, azd: bool = True,
             env: Optional[Dict[str, str]] = None, extra: Optional[List[Dict[str, Any]]] = None) -> Run:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        tools = ("az", "azd") if azd else ("az",)
        for tool in tools:
            path = bin_dir / tool
            path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" {tool} "$@"\n')
            path.chmod(0o755)
        world = tmp_path / "world.json"
        recorded = _world(vms or [_vm("web-01")], sets or [], azd)
        recorded["az"] = (extra or []) + recorded["az"]  # the first matching recording answers
        world.write_text(json.dumps(recorded))
        log = tmp_path / "calls.jsonl"
        if log.exists():
            log.unlink()
        # Only the stubs and the system's basic tools: a real az/azd on this machine must not answer.
        system_path = ":".join(p for p in ("/usr/bin", "/bin") if Path(p).is_dir())
        environ = {"PATH": f"{bin_dir}:{system_path}", "HOME": str(tmp_path), "LANG": "C.UTF-8",
                   "STUB_WORLD": str(world), "STUB_LOG": str(log)}
        environ.update(env or {})
        result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                                env=environ, timeout=120, cwd=tmp_path)
        return Run(result, log)
    return _run


PROD_CLIENT = "0f4c2d8e-6a1b-4c3d-9e7f-5a6b7c8d9e01"
UAI = (f"/subscriptions/{SUB}/resourceGroups/rg-se-prod/providers/Microsoft.ManagedIdentity/"
       "userAssignedIdentities/id-se-vm-k3x7m2pq9v4ab")
TEST_CLIENT = "1a2b3c4d-5e6f-4a1b-8c2d-3e4f5a6b7c8d"


def _expected(tok: str = "k3x7m2pq9v4ab", client: str = PROD_CLIENT, env: str = "se-prod") -> Dict[str, str]:
    return {
        "artifactsUrl": f"https://stsea{tok}.blob.core.windows.net/forwarder-artifacts",
        "eventHubNamespace": f"evhns-se-{tok}.servicebus.windows.net",
        "eventHubName": "scheduled-events",
        "vmIdentityClientId": client,
        "queueServiceUri": f"https://stse{tok}.queue.core.windows.net/",
        "storageAccountId": f"/subscriptions/{SUB}/resourceGroups/rg-{env}/providers/Microsoft.Storage/"
                            f"storageAccounts/stse{tok}",
    }


def _identities(call: List[str]) -> List[str]:
    start = call.index("--identities") + 1
    values = []
    for arg in call[start:]:
        if arg.startswith("-"):
            break
        values.append(arg)
    return values


def test_inputs_from_the_azd_environment(run) -> None:
    result = run(["-g", "my-vms", "vm:web-01"])
    assert result.code == 0, result.err
    assert "inputs from: azd:se-prod" in result.out
    assert result.az("deployment sub") == []  # nothing read from ARM: azd had every value
    (create,) = result.az("deployment group create")
    params = result.params(create)
    assert params.pop("vmName") == "web-01" and params.pop("osType") == "Linux"
    assert params == _expected()
    (assign,) = result.az("vm identity assign")
    assert _identities(assign) == ["[system]", UAI]  # its own identity (its queue) + the shared one (the hub)


def test_inputs_from_a_named_deployment_whatever_the_casing_of_its_outputs(run) -> None:
    result = run(["-g", "my-vms", "-d", "se-prod-1732460000", "vm:web-01"], azd=False)
    assert result.code == 0, result.err
    assert "inputs from: deployment:se-prod-1732460000" in result.out
    (create,) = result.az("deployment group create")
    params = result.params(create)
    assert {k: params[k] for k in _expected()} == _expected()
    (assign,) = result.az("vm identity assign")  # VM_IDENTITY_ID came back from ARM as vM_IDENTITY_ID
    assert _identities(assign) == ["[system]", UAI]


def test_inputs_from_the_newest_successful_deployment_of_the_environment(run) -> None:
    # se-prod has an older success, the wanted one, and a newer failure (azd names: <env>-<unix time>).
    result = run(["-g", "my-vms", "-e", "se-prod", "vm:web-01"], azd=False)
    assert result.code == 0, result.err
    assert "deployment:se-prod-1732460000" in result.out
    (create,) = result.az("deployment group create")
    assert result.params(create)["eventHubNamespace"] == "evhns-se-k3x7m2pq9v4ab.servicebus.windows.net"


def test_a_deployment_named_after_the_environment_without_azd_tags(run) -> None:
    # docs/deploy.md's az path: `az deployment sub create --name <env>`, no tags; found by environmentName.
    result = run(["-g", "my-vms", "vm:web-01"], azd=False, env={"AZURE_ENV_NAME": "se-test"})
    assert result.code == 0, result.err
    assert "deployment:se-test" in result.out
    (create,) = result.az("deployment group create")
    params, expected = result.params(create), _expected("t5t5t5t5t5t5t", TEST_CLIENT, "se-test")
    assert {k: params[k] for k in expected} == expected


def test_environment_variables_win_per_value(run) -> None:
    result = run(["-g", "my-vms", "vm:web-01"], env={"EVENTHUB_NAME": "other-hub"})
    assert result.code == 0, result.err
    assert "inputs from: environment azd:se-prod" in result.out
    (create,) = result.az("deployment group create")
    params = result.params(create)
    assert params["eventHubName"] == "other-hub"
    assert params["eventHubNamespace"] == _expected()["eventHubNamespace"]


def test_no_source_is_one_clear_line_and_changes_nothing(run) -> None:
    result = run(["-g", "my-vms", "vm:web-01"], azd=False)
    assert result.code == 3
    assert result.err.count("\n") == 1 and result.err.startswith("install-on-vms: no value for")
    assert "-e ENVIRONMENT" in result.err and "Traceback" not in result.err
    assert result.az("vm identity assign") == [] and result.az("deployment group create") == []


def test_an_unknown_named_deployment_exits_3(run) -> None:
    result = run(["-g", "my-vms", "-d", "nope", "vm:web-01"], azd=False)
    assert result.code == 3 and "subscription deployment 'nope'" in result.err
    assert result.az("deployment group create") == []


def test_uniform_scale_set_gets_the_model_then_every_instance(run) -> None:
    ids = ("3c8e0b0e-1d4a-4c55-9a0f-6f3f0a6d2b11", "A1B2C3D4-0000-4000-8000-00000000BEEF")
    result = run(["-g", "my-vms", "vmss:pool-u"], sets=[_vmss("pool-u", "Uniform", "Windows", ids)])
    assert result.code == 0, result.err
    (assign,) = result.az("vmss identity assign")
    assert _identities(assign) == ["[system]", UAI]  # the instances share the scale set's identity
    (create,) = result.az("deployment group create")
    assert result.option(create, "-f").endswith("install-vmss.bicep")
    params = result.params(create)
    assert params["osType"] == "Windows" and json.loads(params["instanceVmIds"]) == list(ids)
    (update,) = result.az("vmss update-instances")
    assert result.option(update, "--instance-ids") == "*"


def test_flexible_scale_set_installs_on_each_member_vm(run) -> None:
    vms = [_vm("flex-1", scale_set="pool-f"), _vm("flex-2", scale_set="Pool-F"), _vm("web-01")]
    result = run(["-g", "my-vms", "vmss:pool-f"], vms=vms, sets=[_vmss("pool-f", "Flexible")])
    assert result.code == 0, result.err
    creates = result.az("deployment group create")
    assert sorted(result.params(c)["vmName"] for c in creates) == ["flex-1", "flex-2"]
    assert all(result.option(c, "-f").endswith("install-vm.bicep") for c in creates)
    assert result.az("vmss update-instances") == [] and result.az("vmss identity assign") == []


def test_all_covers_every_vm_and_every_uniform_scale_set(run) -> None:
    vms = [_vm("web-01"), _vm("win-01", "Windows"), _vm("flex-1", scale_set="pool-f")]
    sets = [_vmss("pool-f", "Flexible"), _vmss("pool-old", None),
            _vmss("pool-u", "Uniform", vm_ids=("0e2d1b36-7f0a-4d7e-8c59-9c2f4d1e6a73",))]
    result = run(["-g", "my-vms", "all"], vms=vms, sets=sets)
    assert result.code == 0, result.err
    creates = result.az("deployment group create")
    names = sorted(result.params(c).get("vmName") or "vmss:" + result.params(c)["vmssName"] for c in creates)
    assert names == ["flex-1", "vmss:pool-old", "vmss:pool-u", "web-01", "win-01"]
    os_types = {result.params(c).get("vmName"): result.params(c)["osType"] for c in creates}
    assert os_types["win-01"] == "Windows" and os_types["web-01"] == "Linux"


def test_deployment_names_fit_arm_for_the_longest_names(run) -> None:
    twin = LONG[:-1] + "y"  # the same first 63 characters: the names must still differ
    result = run(["-g", "my-vms", f"vm:{LONG}", f"vm:{twin}"], vms=[_vm(LONG), _vm(twin)])
    assert result.code == 0, result.err
    names = [result.option(c, "-n") for c in result.az("deployment group create")]
    assert len(names) == 2 and len(set(names)) == 2
    assert all(len(n) <= 64 for n in names), names


def test_dry_run_changes_nothing_and_prints_the_commands(run) -> None:
    result = run(["-g", "my-vms", "--dry-run", "vm:web-01"])
    assert result.code == 0, result.err
    assert result.az("vm identity assign") == [] and result.az("deployment group create") == []
    assert "+ az deployment group create -g my-vms" in result.out


def test_a_failing_target_does_not_stop_the_others(run) -> None:
    vms = [_vm("web-01"), _vm("web-02")]
    result = run(["-g", "my-vms", "vm:ghost", "vm:web-02"], vms=vms)
    assert result.code == 4
    assert "failed: vm:ghost" in result.err
    assert [result.params(c)["vmName"] for c in result.az("deployment group create")] == ["web-02"]


@pytest.mark.parametrize("args, message", [
    (["vm:web-01"], "-g NAME"),
    (["-g", "my-vms"], "at least one target"),
    (["-g", "my-vms", "box:web-01"], "vm:NAME, vmss:NAME, avset:NAME or all"),
    (["-g", "my-vms", "--os", "BeOS", "vm:web-01"], "--os is Linux or Windows"),
    (["-g", "my-vms", "-e", "bad'name", "vm:web-01"], "letters, digits and hyphens"),
])
def test_bad_usage_exits_2(run, args: List[str], message: str) -> None:
    result = run(args)
    assert result.code == 2 and message in result.err
    assert result.calls == []


def test_help_lists_the_targets(run) -> None:
    result = run(["--help"])
    assert result.code == 0 and "vmss:NAME" in result.out and "Flexible" in result.out


def test_the_script_is_valid_bash() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert os.access(SCRIPT, os.X_OK)
