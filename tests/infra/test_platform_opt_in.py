"""The platform feed's opt-in (issue 23, point 5): infra/forwarder/install-on-vms.sh --platform-feed and
--agentless, with availability-set targets, the real script in real bash against the stand-in `az`/`azd`
of tests/infra/stub_cli.py (as test_install_on_vms.py does).

What must hold: the resource that owns a VM's scheduled events (the VM, or its availability set or scale
set) gets scheduledEventsPolicy's Event Grid and Resource Graph target through a Compute 2025-04-01 PATCH,
and central's Function app identity gets Scheduled Events Contributor at that resource, never wider; each
owner once per run; --agentless installs no forwarder and needs only central's identity; the preview
features are checked first, and a missing one is one actionable line and changes nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.infra import test_install_on_vms as install

SUB, _vm, _vmss = install.SUB, install._vm, install._vmss
run = install.run  # the fixture: the real script in bash, the stand-in az/azd on PATH

REPO = Path(__file__).resolve().parents[2]
POLICY_BODY = REPO / "infra" / "forwarder" / "platform-opt-in.json"
OPT_IN = REPO / "infra" / "forwarder" / "platform-opt-in.sh"
TYPES = REPO.parent / "shared" / "bicep-types"  # beside the checkout, as CI lays it
CONTRIBUTOR = "b67fe603-310e-4889-b9ee-8257d09d353d"
FUNCTION_PRINCIPAL = "5d9e2b71-3c4a-4f8e-b1d6-7a2c9e0f4b38"  # the recordings' FUNCTION_PRINCIPAL_ID
COMPUTE = f"/subscriptions/{SUB}/resourceGroups/my-vms/providers/Microsoft.Compute"


def _features(compute: str = "Registered", maintenance: str = "Registered") -> List[Dict[str, Any]]:
    return [{"command": "feature show", "options": {"--namespace": ns, "--name": name},
             "result": {"name": f"{ns}/{name}", "properties": {"state": state}}}
            for ns, name, state in (("Microsoft.Compute", "SendScheduledEventsPolicy", compute),
                                    ("Microsoft.Maintenance", "ScheduledEventsActivity", maintenance))]


def _writes() -> List[Dict[str, Any]]:
    return [{"command": "rest", "result": {}}, {"command": "role assignment create", "result": {}},
            {"command": "account show", "result": {"id": SUB, "name": "prod"}}]


def _avset(name: str, members: List[str]) -> Dict[str, Any]:
    return {"command": "vm availability-set show", "options": {"--name": name},
            "result": {"name": name, "id": f"{COMPUTE}/availabilitySets/{name}",
                       "virtualMachines": [{"id": f"{COMPUTE.upper()}/virtualMachines/{m}"}
                                           for m in members]}}


def _in_avset(name: str, avset: str) -> Dict[str, Any]:
    vm = _vm(name)
    vm["availabilitySet"] = {"id": f"{COMPUTE}/availabilitySets/{avset}"}
    return vm


def _set(name: str, mode: str, **kwargs: Any) -> Dict[str, Any]:
    vmss = _vmss(name, mode, **kwargs)
    vmss["id"] = f"{COMPUTE}/virtualMachineScaleSets/{name}"
    return vmss


def _opt_ins(result) -> List[str]:
    """The resource ids PATCHed, checking each PATCH's form on the way."""
    ids = []
    for call in result.az("rest"):
        assert result.option(call, "--method") == "patch"
        assert result.option(call, "--body") == f"@{POLICY_BODY}"
        url = result.option(call, "--url")
        path, _, query = url.partition("?")
        assert query == "api-version=2025-04-01", url
        ids.append(path)
    return ids


def _grants(result) -> List[str]:
    """The scopes of central's role assignments, checking each assignment's form on the way."""
    scopes = []
    for call in result.az("role assignment create"):
        assert result.option(call, "--assignee-object-id") == FUNCTION_PRINCIPAL
        assert result.option(call, "--assignee-principal-type") == "ServicePrincipal"
        assert result.option(call, "--role") == CONTRIBUTOR
        scopes.append(result.option(call, "--scope"))
    return scopes


def test_a_standalone_vm_is_opted_in_at_the_vm(run) -> None:
    result = run(["-g", "my-vms", "--platform-feed", "vm:web-01"], extra=_features() + _writes())
    assert result.code == 0, result.err
    assert len(result.az("deployment group create")) == 1  # the forwarder as well
    vm_id = f"{COMPUTE}/virtualMachines/web-01"
    assert _opt_ins(result) == [vm_id] and _grants(result) == [vm_id]
    assert len(result.az("feature show")) == 2
    assert "virtualMachines/web-01 opted in" in result.out
    assert f"list /subscriptions/{SUB}/resourceGroups/my-vms in platformConfirmScopes" in result.out


def test_a_vm_in_an_availability_set_opts_in_the_set_not_the_vm(run) -> None:
    vms = [_in_avset("av-1", "avs-web")]
    result = run(["-g", "my-vms", "--platform-feed", "vm:av-1"], vms=vms, extra=_features() + _writes())
    assert result.code == 0, result.err
    owner = f"{COMPUTE}/availabilitySets/avs-web"
    assert _opt_ins(result) == [owner] and _grants(result) == [owner]


def test_an_availability_set_target_installs_every_member_and_opts_the_set_in_once(run) -> None:
    vms = [_in_avset("av-1", "avs-web"), _in_avset("av-2", "avs-web"), _vm("web-01")]
    result = run(["-g", "my-vms", "--platform-feed", "avset:avs-web"], vms=vms,
                 extra=_features() + _writes() + [_avset("avs-web", ["av-1", "av-2"])])
    assert result.code == 0, result.err
    creates = result.az("deployment group create")
    assert sorted(result.params(c)["vmName"] for c in creates) == ["av-1", "av-2"]
    assert all(result.option(c, "-f").endswith("install-vm.bicep") for c in creates)
    owner = f"{COMPUTE}/availabilitySets/avs-web"
    assert _opt_ins(result) == [owner] and _grants(result) == [owner]


def test_an_availability_set_without_the_feed_gets_only_the_forwarder(run) -> None:
    vms = [_in_avset("av-1", "avs-web")]
    result = run(["-g", "my-vms", "avset:avs-web"], vms=vms, extra=[_avset("avs-web", ["av-1"])])
    assert result.code == 0, result.err
    assert [result.params(c)["vmName"] for c in result.az("deployment group create")] == ["av-1"]
    assert result.az("rest") == [] and result.az("role assignment create") == []
    assert result.az("feature show") == []


def test_flexible_members_opt_in_their_scale_set_once(run) -> None:
    vms = [_vm("flex-1", scale_set="pool-f"), _vm("flex-2", scale_set="pool-f")]
    result = run(["-g", "my-vms", "--platform-feed", "vmss:pool-f", "vm:flex-1"], vms=vms,
                 sets=[_set("pool-f", "Flexible")], extra=_features() + _writes())
    assert result.code == 0, result.err
    # vm:flex-1's owner is the scale set too (the id as ARM cased it: compared without regard to case)
    owner = f"{COMPUTE}/virtualMachineScaleSets/pool-f"
    assert [i.lower() for i in _opt_ins(result)] == [owner.lower()]
    assert [s.lower() for s in _grants(result)] == [owner.lower()]


def test_a_uniform_scale_set_is_opted_in_at_the_scale_set(run) -> None:
    ids = ("3c8e0b0e-1d4a-4c55-9a0f-6f3f0a6d2b11",)
    result = run(["-g", "my-vms", "--platform-feed", "vmss:pool-u"],
                 sets=[_set("pool-u", "Uniform", vm_ids=ids)], extra=_features() + _writes())
    assert result.code == 0, result.err
    owner = f"{COMPUTE}/virtualMachineScaleSets/pool-u"
    assert _opt_ins(result) == [owner] and _grants(result) == [owner]
    assert len(result.az("vmss update-instances")) == 1  # the forwarder's install still ran


def test_agentless_installs_nothing_and_needs_only_centrals_identity(run) -> None:
    # No azd environment, no deployment: only FUNCTION_PRINCIPAL_ID, as an environment variable.
    vms = [_vm("web-01"), _in_avset("av-1", "avs-web")]
    result = run(["-g", "my-vms", "--agentless", "vm:web-01", "vm:av-1", "vmss:pool-u", "avset:avs-web"],
                 vms=vms, sets=[_set("pool-u", "Uniform")], azd=False,
                 env={"FUNCTION_PRINCIPAL_ID": FUNCTION_PRINCIPAL},
                 extra=_features() + _writes() + [_avset("avs-web", ["av-1"])])
    assert result.code == 0, result.err
    for command in ("vm identity assign", "vmss identity assign", "deployment group create",
                    "vmss update-instances", "deployment sub list"):
        assert result.az(command) == [], command
    owners = [f"{COMPUTE}/virtualMachines/web-01", f"{COMPUTE}/availabilitySets/avs-web",
              f"{COMPUTE}/virtualMachineScaleSets/pool-u"]
    assert _opt_ins(result) == owners and _grants(result) == owners
    assert "platformConfirmScopes" not in result.out  # no forwarder here makes claims to confirm


def test_inputs_for_the_feed_come_from_the_deployment_too(run) -> None:
    result = run(["-g", "my-vms", "-d", "se-prod-1732460000", "--platform-feed", "vm:web-01"], azd=False,
                 extra=_features() + _writes())
    assert result.code == 0, result.err
    assert _grants(result) == [f"{COMPUTE}/virtualMachines/web-01"]


def test_a_deployment_older_than_the_feed_is_one_clear_line(run) -> None:
    result = run(["-g", "my-vms", "-d", "se-prod-1731000000", "--platform-feed", "vm:web-01"], azd=False,
                 extra=_features() + _writes())
    assert result.code == 3 and "FUNCTION_PRINCIPAL_ID" in result.err
    assert result.err.count("\n") == 1 and "Traceback" not in result.err
    assert result.az("rest") == [] and result.az("deployment group create") == []


@pytest.mark.parametrize("compute, maintenance, missing", [
    ("NotRegistered", "Registered", "Microsoft.Compute/SendScheduledEventsPolicy"),
    ("Registered", "Registering", "Microsoft.Maintenance/ScheduledEventsActivity"),
])
def test_an_unregistered_feature_stops_before_any_change(run, compute: str, maintenance: str,
                                                         missing: str) -> None:
    result = run(["-g", "my-vms", "--platform-feed", "vm:web-01"],
                 extra=_features(compute, maintenance) + _writes())
    assert result.code == 5
    assert result.err.count("\n") == 1 and f"feature {missing}" in result.err
    namespace, name = missing.split("/")
    assert f"az feature register --namespace {namespace} --name {name}" in result.err
    assert f"az provider register -n {namespace}" in result.err
    for command in ("rest", "role assignment create", "deployment group create", "vm identity assign"):
        assert result.az(command) == [], command


def test_a_feed_that_is_off_in_the_deployment_is_a_warning(run) -> None:
    result = run(["-g", "my-vms", "--platform-feed", "vm:web-01"], env={"PLATFORM_FEED_ENABLED": "False"},
                 extra=_features() + _writes())
    assert result.code == 0, result.err
    assert "platform feed is off" in result.err and len(_grants(result)) == 1


def test_an_owner_that_is_not_a_compute_resource_gets_no_role(run) -> None:
    # Whatever ARM answers, the role never lands on a subscription or a resource group.
    vm = _vm("odd")
    vm["id"] = f"/subscriptions/{SUB}"
    result = run(["-g", "my-vms", "--agentless", "vm:odd", "vm:web-01"], vms=[vm, _vm("web-01")],
                 extra=_features() + _writes())
    assert result.code == 4 and "failed: vm:odd" in result.err
    assert _grants(result) == [f"{COMPUTE}/virtualMachines/web-01"]


def test_dry_run_prints_the_patch_and_the_role_and_runs_neither(run) -> None:
    result = run(["-g", "my-vms", "--dry-run", "--agentless", "vm:web-01"], extra=_features())
    assert result.code == 0, result.err
    assert result.az("rest") == [] and result.az("role assignment create") == []
    assert "+ az rest --method patch --url" in result.out
    assert f"--role {CONTRIBUTOR} --scope {COMPUTE}/virtualMachines/web-01" in result.out


def test_help_names_the_new_target_and_options(run) -> None:
    result = run(["--help"])
    assert result.code == 0
    assert all(word in result.out for word in ("avset:NAME", "--platform-feed", "--agentless"))


# ---- what the script sends, checked against the reference ----

def test_the_policy_body_sets_only_the_publishing_target() -> None:
    body = json.loads(POLICY_BODY.read_text())
    # Nothing else in scheduledEventsPolicy: userInitiatedReboot/Redeploy and allInstancesDown stay as set.
    assert body == {"properties": {"scheduledEventsPolicy": {"scheduledEventsAdditionalPublishingTargets": {
        "eventGridAndResourceGraph": {"enable": True, "scheduledEventsApiVersion": "2020-07-01"}}}}}


def test_the_script_constants() -> None:
    text = OPT_IN.read_text()
    assert "COMPUTE_API_VERSION=2025-04-01" in text
    assert f"SCHEDULED_EVENTS_CONTRIBUTOR={CONTRIBUTOR}  # Scheduled Events Contributor" in text
    assert re.search(r"FEATURES=\"Microsoft.Compute/SendScheduledEventsPolicy "
                     r"Microsoft.Maintenance/ScheduledEventsActivity\"", text)


@pytest.mark.skipif(not (TYPES / "index.json").exists(), reason="no bicep-types reference on this machine")
@pytest.mark.parametrize("kind", ["virtualMachines", "virtualMachineScaleSets", "availabilitySets"])
def test_the_policy_body_fits_each_owner_type(kind: str) -> None:
    from tools.bicep_types import Reference, check_body

    reference = Reference(TYPES)
    body = json.loads(POLICY_BODY.read_text())
    assert check_body(reference, f"Microsoft.Compute/{kind}@2025-04-01", body) == []
    # The check can fail: a misspelt property and the version before scheduledEventsApiVersion existed.
    target = body["properties"]["scheduledEventsPolicy"]["scheduledEventsAdditionalPublishingTargets"]
    target["eventGridAndResourceGraph"]["enabled"] = target["eventGridAndResourceGraph"].pop("enable")
    assert any("'enabled'" in p for p in check_body(reference, f"Microsoft.Compute/{kind}@2025-04-01", body))
    older = json.loads(POLICY_BODY.read_text())
    assert any("'scheduledEventsApiVersion'" in p
               for p in check_body(reference, f"Microsoft.Compute/{kind}@2024-07-01", older))


@pytest.mark.skipif(not (TYPES / "builtin-roles.json").exists(), reason="the built-in roles list is not here")
def test_the_role_is_the_builtin_scheduled_events_contributor() -> None:
    roles = json.loads((TYPES / "builtin-roles.json").read_text())["roles"]
    assert roles[CONTRIBUTOR]["roleName"] == "Scheduled Events Contributor"
