"""central/cli/coverage.py, the pure part of `se-fleet coverage`: Resource Graph rows (as the coverage
query projects them) turned into VMs with their owner, and one verdict per VM from them and central's
fleet view. Every kind of VM: standalone, availability set member, Flexible member, Uniform instance."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from central.cli import coverage

SUB = "0b5f2a9e-6c1d-4e8f-9a7b-3c2d1e0f4a5b"
RG = f"/subscriptions/{SUB}/resourceGroups/apps/providers/Microsoft.Compute"
CENTRAL = "7d3c9a1e-2b4f-4c6d-8e0a-1f2b3c4d5e6f"


def vm(name: str, vm_id: str, owner: str = "", feed: Any = None, tags: Any = None) -> Dict[str, Any]:
    return {"id": f"{RG}/virtualMachines/{name}", "name": name, "type": "microsoft.compute/virtualmachines",
            "subscriptionId": SUB, "resourceGroup": "apps", "tags": tags, "vmId": vm_id, "owner": owner,
            "feed": feed}


def extension(vm_name: str, state: str = "Succeeded") -> Dict[str, Any]:
    return {"id": f"{RG}/virtualMachines/{vm_name}/extensions/se-forwarder-install-linux",
            "name": "se-forwarder-install-linux", "type": "microsoft.compute/virtualmachines/extensions",
            "subscriptionId": SUB, "resourceGroup": "apps", "provisioningState": state}


def owner(kind: str, name: str, feed: Any = None, extensions: Any = None, tags: Any = None) -> Dict[str, Any]:
    path = {"vmss": "virtualMachineScaleSets", "avset": "availabilitySets"}[kind]
    return {"id": f"{RG}/{path}/{name}", "name": name, "type": f"microsoft.compute/{path.lower()}",
            "subscriptionId": SUB, "resourceGroup": "apps", "feed": feed, "extensions": extensions,
            "tags": tags, "orchestrationMode": "Uniform" if kind == "vmss" else ""}


def instance(scale_set: str, n: int, vm_id: str) -> Dict[str, Any]:
    return {"id": f"{RG}/virtualMachineScaleSets/{scale_set}/virtualMachines/{n}", "name": f"{scale_set}_{n}",
            "type": "microsoft.compute/virtualmachinescalesets/virtualmachines", "subscriptionId": SUB,
            "resourceGroup": "apps", "vmId": vm_id}


ROWS: List[Dict[str, Any]] = [
    vm("heard", "id-heard"), extension("heard"),
    vm("quiet", "id-quiet"), extension("quiet"),
    vm("failed", "id-failed"), extension("failed", "Failed"),
    vm("nothing", "id-nothing"),
    vm("opted", "id-opted", feed=True),
    vm("opted-no-role", "id-opted2", feed=True),
    vm("off", "id-off", tags={"SE-Forwarder": "OFF"}),
    owner("avset", "as1", feed=True), vm("member", "id-member", owner=f"{RG}/availabilitySets/as1"),
    owner("vmss", "web", extensions=[{"name": "se-forwarder-install-linux"}]),
    instance("web", 0, "id-web0"), instance("web", 1, "id-web1"),
    owner("vmss", "bare", feed=True, tags={"se-forwarder": "agentless"}), instance("bare", 0, "id-bare0"),
]
FLEET = {"vms": [{"vmId": "ID-HEARD", "silent": False, "lastSeen": "2026-12-07T10:00:00Z"},
                 {"vmId": "id-quiet", "silent": True, "lastSeen": "2026-12-07T08:00:00Z"},
                 {"vmId": "id-web0", "silent": False, "lastSeen": "2026-12-07T10:00:00Z"}]}
ROLES = [f"{RG}/virtualMachines/opted".upper(), f"/subscriptions/{SUB}/resourceGroups/apps/providers/"
         "Microsoft.Compute/availabilitySets/as1", f"{RG}/virtualMachineScaleSets/bare"]


def verdicts(rows: List[Dict[str, Any]] = ROWS, fleet: Dict[str, Any] = FLEET,
             roles: List[str] = ROLES) -> Dict[str, str]:
    return {c.machine.name: c.verdict for c in coverage.cover(coverage.machines(rows), fleet, roles)}


def test_every_kind_of_vm_gets_its_verdict() -> None:
    assert verdicts() == {
        "heard": "agent", "quiet": "silent agent", "failed": "blind", "nothing": "blind",
        "opted": "agentless", "opted-no-role": "blind", "off": "excluded", "member": "agentless",
        "web_0": "agent", "web_1": "silent agent", "bare_0": "agentless"}


def test_owners_are_the_vm_its_set_or_its_scale_set() -> None:
    found = {m.name: m for m in coverage.machines(ROWS)}
    assert found["member"].owner == f"{RG}/availabilitySets/as1".lower()
    assert found["web_1"].owner == f"{RG}/virtualMachineScaleSets/web".lower()
    assert found["nothing"].owner == f"{RG}/virtualMachines/nothing".lower()
    assert found["web_1"].installed and not found["bare_0"].installed
    assert "as1" not in found and "web" not in found  # owners are not VMs


def test_the_tag_is_read_where_the_policies_read_it() -> None:
    rows = [owner("vmss", "web", tags={"se-forwarder": "off"}), instance("web", 0, "id-w"),
            owner("avset", "as2", tags={"se-forwarder": "off"}),
            vm("member2", "id-m2", owner=f"{RG}/availabilitySets/as2")]
    assert verdicts(rows, {"vms": []}, []) == {"web_0": "excluded", "member2": "blind"}


def test_a_vm_listed_as_a_vm_and_an_instance_counts_once() -> None:
    rows = [*ROWS, {**instance("flex", 0, "id-heard"), "name": "heard-again"}]
    assert [m.name for m in coverage.machines(rows)].count("heard-again") == 0
    assert len(coverage.machines(rows)) == len(coverage.machines(ROWS))


def test_a_role_above_the_owner_lets_central_approve() -> None:
    group = [f"/subscriptions/{SUB}/resourceGroups/APPS"]
    assert verdicts(roles=group)["opted-no-role"] == "agentless"
    assert not coverage.approvable(f"{RG}/virtualMachines/x", [f"/subscriptions/{SUB}/resourceGroups/app"])
    assert verdicts(roles=[])["opted"] == "blind"


def test_a_vm_central_knows_but_does_not_hear_is_a_silent_agent() -> None:
    fleet = {"vms": [*FLEET["vms"], {"vmId": "id-nothing", "silent": True}]}
    assert verdicts(fleet=fleet)["nothing"] == "silent agent"
    assert verdicts(fleet={"vms": []})["heard"] == "silent agent"


def test_counts_by_subscription_and_resource_group() -> None:
    covered = coverage.cover(coverage.machines(ROWS), FLEET, ROLES)
    summary = coverage.counts(covered)
    assert summary["vms"] == 11
    assert summary["byVerdict"] == {"agent": 2, "agentless": 3, "silent agent": 2, "blind": 3, "excluded": 1}
    assert summary["byResourceGroup"] == [{"subscription": SUB, "resourceGroup": "apps", "agent": 2,
                                           "agentless": 3, "silent agent": 2, "blind": 3, "excluded": 1}]
    text = coverage.render(covered)
    assert text.splitlines()[1].split()[3] == "BLIND"  # the blind first
    assert text.splitlines()[-1] == "11 VM(s): 2 agent, 3 agentless, 2 silent agent, 3 blind, 1 excluded"
    assert [line.split()[0] for line in coverage.render(covered, blind_only=True).splitlines()[1:4]] == \
        ["failed", "nothing", "opted-no-role"]


def test_queries_take_only_checked_values() -> None:
    assert 'resourceGroup =~ "apps"' in coverage.inventory_query("apps")
    whole = coverage.inventory_query()
    assert "computeresources" in whole and "resourceGroup =~" not in whole
    assert CENTRAL in coverage.role_query(CENTRAL)
    with pytest.raises(ValueError):
        coverage.role_query('x" or 1 == 1 //')
