"""infra/coverage/: the Azure Policy initiative's rules, checked against Azure's own data (offline):
- every alias a rule names is one Azure publishes for that type (the alias tables of
  maciejporebski/azure-policy-aliases, Get-AzPolicyAlias output, in tools/policy_reference.py's cache);
- each existenceCondition holds for what the rule's deployment writes, and a Modify's operations make its
  `if` false (remediated means compliant);
- roleDefinitionIds are the roles the embedded deployment needs, and the assignment's identity gets them;
- the embedded templates' resources fit Azure's resource types (../shared/bicep-types and the cache);
- tags leave a VM alone, `agentless` keeps the platform feed only, and each kind of VM has its rule.
The rule language is read by tests/infra/policy_rules.py (a reading of the documented language, not
Azure's engine: what only Azure can confirm is listed in docs/deploy.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Set, Tuple

import pytest

from tests.infra import policy_rules as rules
from tools import policy_reference
from tools.bicep_types import EXPR, Reference, check_body

REPO = Path(__file__).resolve().parents[2]
COVERAGE = REPO / "infra" / "coverage"
SHARED_TYPES = REPO.parent / "shared" / "bicep-types"
DEFINITIONS = {p.stem: json.loads(p.read_text()) for p in sorted((COVERAGE / "definitions").glob("*.json"))}
INITIATIVE = json.loads((COVERAGE / "initiative.json").read_text())

VMC = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
MIO = "f1a07417-d97a-45cb-824c-7a7467783830"
SAC = "17d1049b-9a84-46fb-8f53-869881c3d3ab"
RBAC = "f58310d9-a9f6-439a-9e8d-f62e7b41a168"
# Built-in roles ../shared/bicep-types/builtin-roles.json does not list yet, with their names in
# MicrosoftDocs/azure-docs articles/role-based-access-control/built-in-roles/{compute,identity,storage,
# privileged}.md (read 2026-12 with the search tool). Built-in role ids are global and never change.
MORE_ROLES = {VMC: "Virtual Machine Contributor", MIO: "Managed Identity Operator",
              SAC: "Storage Account Contributor", RBAC: "Role Based Access Control Administrator"}
# What each resource an embedded deployment writes needs (the narrowest built-in role that can).
NEEDS = {
    "microsoft.compute/virtualmachines": VMC,
    "microsoft.compute/virtualmachines/extensions": VMC,
    "microsoft.compute/virtualmachinescalesets": VMC,
    "microsoft.compute/virtualmachinescalesets/extensions": VMC,
    "microsoft.storage/storageaccounts/queueservices/queues": SAC,
    "microsoft.authorization/roleassignments": RBAC,
}
TOP_LEVEL = {"type", "name", "location", "id", "kind"}
READ_ONLY = {"properties.provisioningState"}  # Azure writes it: Succeeded when the deployment did


@pytest.fixture(scope="module")
def cache() -> Path:
    directory = policy_reference.cache_dir()
    absent = policy_reference.missing(directory)
    if absent:  # reference data no registry serves, like ../shared/bicep-types: skipped with this reason
        pytest.skip(f"the policy reference cache {directory} lacks {sorted(absent)} on this machine: fill it "
                    "with `python -m tools.policy_reference fill --types-git <Azure/bicep-types-az git dir> "
                    "--aliases-git <maciejporebski/azure-policy-aliases git dir>` (docs/deploy.md)")
    return directory


@pytest.fixture(scope="module")
def aliases(cache: Path) -> Dict[str, str]:
    return policy_reference.load_aliases(cache)


def _ids(role_ids: List[str]) -> Set[str]:
    return {r.rsplit("/", 1)[-1] for r in role_ids}


def _template_resources(template: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for resource in template.get("resources", []):
        yield resource
        inner = resource.get("properties", {}).get("template")
        if isinstance(inner, Mapping):
            yield from _template_resources(inner)


def _details(name: str) -> Mapping[str, Any]:
    return DEFINITIONS[name]["policyRule"]["then"]["details"]


def _template_expressions(template: Mapping[str, Any], params: Mapping[str, Any]) -> rules.Expressions:
    expressions: rules.Expressions
    functions = {
        "parameters": lambda n: params[n],
        "variables": lambda n: expressions.value(template["variables"][n]),
        "subscriptionResourceId": lambda t, n: f"/subscriptions/0000/providers/{t}/{n}",
    }
    expressions = rules.Expressions(functions)
    return expressions


def _get(body: Mapping[str, Any], path: str) -> Any:
    for part in path.split("."):
        body = body[part]
    return body


@pytest.mark.parametrize("name", sorted(DEFINITIONS))
def test_every_alias_a_rule_names_exists(name: str, aliases: Dict[str, str]) -> None:
    named = [f for f in rules.walk_fields(DEFINITIONS[name]["policyRule"])
             if f not in TOP_LEVEL and not f.startswith("[")]
    assert named, "a rule with no alias checks nothing"
    unknown = [f for f in named if f.lower() not in aliases]
    assert unknown == [], f"{name}: not aliases Azure publishes: {unknown}"


def test_the_alias_check_catches_a_typo(aliases: Dict[str, str]) -> None:
    typo = "Microsoft.Compute/virtualMachines/storageProfile.osDisk.osTyp"
    assert typo.lower() not in aliases
    assert "microsoft.compute/virtualmachines/storageprofile.osdisk.ostype" in aliases


@pytest.mark.parametrize("name,os_type", [("forwarder-vm", "Linux"), ("forwarder-vm", "Windows"),
                                          ("forwarder-vmss", "Linux"), ("forwarder-vmss", "Windows")])
def test_existence_condition_holds_for_what_the_deployment_writes(
        name: str, os_type: str, aliases: Dict[str, str]) -> None:
    details = _details(name)
    params = {"osType": os_type}
    policy = rules.policy_expressions(params)
    template = details["deployment"]["properties"]["template"]
    template_params = {k: f"<{k}>" for k in template["parameters"]}
    template_params["osType"] = os_type
    written = _template_expressions(template, template_params)
    [extension] = [r for r in template["resources"] if r["type"] == details["type"]]
    # The related resource's name is the child's, as the deployment writes it (parent/child).
    body: Dict[str, Any] = {"name": written.value(extension["name"]).split("/")[-1], "type": details["type"],
                            "properties": {}}
    assert "name" not in details  # found by the existence condition, not by a name lookup
    for condition in details["existenceCondition"]["allOf"]:
        if condition["field"] in TOP_LEVEL:
            continue
        path = aliases[condition["field"].lower()]
        section, _, key = path.partition(".")
        value = "Succeeded" if path in READ_ONLY else written.value(_get(extension, path))
        body.setdefault(section, {})[key] = value
    assert rules.matches(details["existenceCondition"], body, policy, aliases)
    # ...and fails for another CustomScript extension, or one of another publisher (the check can fail).
    assert not rules.matches(details["existenceCondition"], {**body, "name": "someone-elses-script"}, policy,
                             aliases)
    body["properties"]["publisher"] = "Microsoft.Azure.Monitor"
    assert not rules.matches(details["existenceCondition"], body, policy, aliases)


def test_central_role_existence_condition_holds_for_what_its_deployment_writes(
        aliases: Dict[str, str]) -> None:
    details = _details("feed-role")
    params = {"centralPrincipalId": "11111111-2222-3333-4444-555555555555"}
    policy = rules.policy_expressions(params)
    template = details["deployment"]["properties"]["template"]
    given = details["deployment"]["properties"]["parameters"]
    passed = {k: f"<{k}>" if "field(" in v["value"] else policy.value(v["value"]) for k, v in given.items()}
    written = _template_expressions(template, passed)
    [assignment] = [r for r in template["resources"] if r["type"] == details["type"]]
    body = {"properties": {k: written.value(v) for k, v in assignment["properties"].items()}}
    assert rules.matches(details["existenceCondition"], body, policy, aliases)
    # At the owner itself, never wider (the owner's type and name, as the policy passes them).
    assert written.value(assignment["scope"]) == "<ownerType>/<ownerName>"
    body["properties"]["principalId"] = "someone-else"
    assert not rules.matches(details["existenceCondition"], body, policy, aliases)


OWNERS = {
    "vm": {"type": "Microsoft.Compute/virtualMachines", "name": "vm1", "properties": {}},
    "vmss": {"type": "Microsoft.Compute/virtualMachineScaleSets", "name": "ss1", "properties": {}},
    "avset": {"type": "Microsoft.Compute/availabilitySets", "name": "as1", "properties": {}},
}


@pytest.mark.parametrize("owner", sorted(OWNERS))
def test_the_opt_in_modify_makes_its_owner_compliant(owner: str, aliases: Dict[str, str]) -> None:
    definition = DEFINITIONS["feed-opt-in"]
    resource = json.loads(json.dumps(OWNERS[owner]))
    assert rules.applies(definition, {}, resource, aliases)
    expressions = rules.policy_expressions({}, resource, aliases)
    done = 0
    for operation in definition["policyRule"]["then"]["details"]["operations"]:
        if not expressions.value(operation["condition"]):
            continue
        node = resource
        *parents, leaf = aliases[operation["field"].lower()].split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = operation["value"]
        done += 1
    assert done == 2  # enable and the API version, on this type only
    assert not rules.applies(definition, {}, resource, aliases)
    policy = resource["properties"]["scheduledEventsPolicy"]["scheduledEventsAdditionalPublishingTargets"]
    assert policy == json.loads((REPO / "infra/forwarder/platform-opt-in.json").read_text())[
        "properties"]["scheduledEventsPolicy"]["scheduledEventsAdditionalPublishingTargets"]


def _needed(details: Mapping[str, Any]) -> Set[str]:
    if "operations" in details:
        return {VMC for op in details["operations"] if op["field"].startswith("Microsoft.Compute/")}
    needed: Set[str] = set()
    for resource in _template_resources(details["deployment"]["properties"]["template"]):
        kind = resource["type"].lower()
        if kind == "microsoft.resources/deployments":
            continue
        needed.add(NEEDS[kind])
        if "userAssignedIdentities" in resource.get("identity", {}):
            needed.add(MIO)  # attaching a user-assigned identity is .../assign/action on it
    return needed


@pytest.mark.parametrize("name", sorted(DEFINITIONS))
def test_role_definition_ids_are_the_roles_the_deployment_needs(name: str) -> None:
    details = _details(name)
    assert _ids(details["roleDefinitionIds"]) == _needed(details)
    for role in details["roleDefinitionIds"]:
        assert re.fullmatch(r"/providers/Microsoft\.Authorization/roleDefinitions/[0-9a-f-]{36}", role)


def test_the_roles_are_built_in_roles() -> None:
    builtin = json.loads((SHARED_TYPES / "builtin-roles.json").read_text())["roles"]
    named = {**{k: v["roleName"] for k, v in builtin.items()}, **MORE_ROLES}
    used = set().union(*(_ids(_details(n)["roleDefinitionIds"]) for n in DEFINITIONS))
    assert used <= set(named), used - set(named)
    granted = {"8a0f0c08-91a1-4084-bc3d-661d67233fed", "b67fe603-310e-4889-b9ee-8257d09d353d"}
    assert {named[g] for g in granted} == {"Storage Queue Data Message Processor",
                                           "Scheduled Events Contributor"}


@pytest.mark.parametrize("main", ["main.bicep", "main-mg.bicep"])
def test_the_assignment_identity_gets_every_role_remediation_needs(main: str) -> None:
    text = (COVERAGE / main).read_text()
    block = text.split("var roles = {", 1)[1].split("}", 1)[0]
    granted = set(re.findall(r"'([0-9a-f-]{36})'", block))
    granted |= set(re.findall(r"'([0-9a-f-]{36})'", (COVERAGE / "storage-access.bicep").read_text()))
    used = set().union(*(_ids(_details(n)["roleDefinitionIds"]) for n in DEFINITIONS))
    assert granted == used
    # The RBAC administrator role may grant only the two roles remediation gives.
    condition = text.split("var grantable = '", 1)[1].split("'", 1)[0]
    assert set(re.findall(r"[0-9a-f-]{36}", condition)) == {"8a0f0c08-91a1-4084-bc3d-661d67233fed",
                                                             "b67fe603-310e-4889-b9ee-8257d09d353d"}


def _symbolic(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("[") and not value.startswith("[["):
        return EXPR
    if isinstance(value, dict):
        return {k: _symbolic(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_symbolic(v) for v in value]
    return value


def _embedded() -> Iterator[Tuple[str, Mapping[str, Any]]]:
    for name in sorted(DEFINITIONS):
        deployment = _details(name).get("deployment")
        if deployment:
            for resource in _template_resources(deployment["properties"]["template"]):
                yield name, resource


def test_embedded_template_resources_fit_the_resource_types(cache: Path) -> None:
    reference = Reference(SHARED_TYPES, cache / "bicep-types")
    checked, problems = 0, []
    for name, resource in _embedded():
        body = {k: _symbolic(v) for k, v in resource.items() if k in ("properties", "identity", "location")}
        if resource["type"] == "Microsoft.Resources/deployments":
            body["properties"] = {**body["properties"], "template": {}}
        found = check_body(reference, f"{resource['type']}@{resource['apiVersion']}", body, name)
        problems += found
        checked += 1
    assert problems == []
    assert checked >= 9


def test_the_type_check_of_embedded_templates_can_fail(cache: Path) -> None:
    reference = Reference(SHARED_TYPES, cache / "bicep-types")
    found = check_body(reference, "Microsoft.Compute/virtualMachines/extensions@2024-07-01",
                       {"properties": {"publisher": "x", "typeHandlerVersoin": "2.1"}})
    assert found and "typeHandlerVersoin" in found[0]


def test_set_references_fit_the_definitions_and_the_assignment() -> None:
    declared = set(INITIATIVE["parameters"])
    for ref in INITIATIVE["policyDefinitions"]:
        definition = DEFINITIONS[ref["definition"]]
        given = set(ref["parameters"])
        assert given <= set(definition["parameters"]), (ref["policyDefinitionReferenceId"], given)
        required = {k for k, v in definition["parameters"].items() if "defaultValue" not in v}
        assert required <= given, (ref["policyDefinitionReferenceId"], required - given)
        for value in ref["parameters"].values():
            for used in re.findall(r"parameters\('([^']+)'\)", str(value["value"])):
                assert used in declared
    for main in ("main.bicep", "main-mg.bicep"):
        block = (COVERAGE / main).read_text().split("var assignmentParameters = {", 1)[1].split("\n}\n", 1)[0]
        assert set(re.findall(r"^  (\w+):", block, re.M)) == declared, main


def test_the_installed_config_has_config_bicep_keys() -> None:
    config = (REPO / "infra/forwarder/config.bicep").read_text().split("var baseSettings = {", 1)[1]
    keys = set(re.findall(r"^  (\w+):", config.split("\n}\n", 1)[0], re.M))
    for name in ("forwarder-vm", "forwarder-vmss"):
        template = _details(name)["deployment"]["properties"]["template"]
        settings = _template_expressions(template, {"osType": "Linux", **{
            k: f"<{k}>" for k in template["parameters"] if k != "osType"}})
        written = settings.value(template["variables"]["settingsBase64"])
        decoded = json.loads(__import__("base64").b64decode(written))
        assert set(decoded) == keys, name
        assert decoded["authenticate"] is True and decoded["queue_client_id"] == ""


def _vm(os_type: str = "Linux", tags: Mapping[str, str] = (), **properties: Any) -> Dict[str, Any]:
    return {"type": "Microsoft.Compute/virtualMachines", "name": "vm", "tags": dict(tags),
            "properties": {"storageProfile": {"osDisk": {"osType": os_type}}, **properties}}


def _vmss(os_type: str = "Linux", mode: str = "Uniform", tags: Mapping[str, str] = ()) -> Dict[str, Any]:
    return {"type": "Microsoft.Compute/virtualMachineScaleSets", "name": "ss", "tags": dict(tags),
            "properties": {"orchestrationMode": mode, "virtualMachineProfile": {
                "storageProfile": {"osDisk": {"osType": os_type}}}}}


def _covered_by(resource: Mapping[str, Any], aliases: Mapping[str, str], **values: str) -> Set[str]:
    """The initiative's references whose `if` holds for the resource."""
    out = set()
    for ref in INITIATIVE["policyDefinitions"]:
        params = {k: v["value"] for k, v in ref["parameters"].items() if not str(v["value"]).startswith("[")}
        params.update({k: v for k, v in values.items() if k in DEFINITIONS[ref["definition"]]["parameters"]})
        if rules.applies(DEFINITIONS[ref["definition"]], params, resource, aliases):
            out.add(ref["policyDefinitionReferenceId"])
    return out


FEED = {"platform-feed-opt-in", "platform-feed-role"}


def test_each_kind_of_vm_has_its_rule(aliases: Dict[str, str]) -> None:
    assert _covered_by(_vm("Linux"), aliases) == {"forwarder-vm-linux"} | FEED
    assert _covered_by(_vm("Windows"), aliases) == {"forwarder-vm-windows"} | FEED
    assert _covered_by(_vmss("Linux"), aliases) == {"forwarder-vmss-linux"} | FEED
    assert _covered_by(_vmss("Windows"), aliases) == {"forwarder-vmss-windows"} | FEED
    # A Flexible scale set: its VMs get the forwarder, the scale set owns their events (the feed).
    assert _covered_by(_vmss("Linux", "Flexible"), aliases) == FEED
    member = _vm("Linux", virtualMachineScaleSet={"id": "/subscriptions/s/.../ss"})
    assert _covered_by(member, aliases) == {"forwarder-vm-linux"}
    in_set = _vm("Windows", availabilitySet={"id": "/subscriptions/s/.../as"})
    assert _covered_by(in_set, aliases) == {"forwarder-vm-windows"}
    assert _covered_by(OWNERS["avset"], aliases) == FEED


def test_tags_leave_a_vm_alone_or_keep_the_feed_only(aliases: Dict[str, str]) -> None:
    assert _covered_by(_vm(tags={"se-forwarder": "off"}), aliases) == set()
    assert _covered_by(_vmss(tags={"se-forwarder": "off"}), aliases) == set()
    assert _covered_by(_vm(tags={"se-forwarder": "agentless"}), aliases) == FEED
    assert _covered_by(_vmss(tags={"se-forwarder": "agentless"}), aliases) == FEED
    # The tag's name and values are parameters.
    assert _covered_by(_vm(tags={"se-forwarder": "off"}), aliases, exclusionTagName="coverage") == \
        {"forwarder-vm-linux"} | FEED
    assert _covered_by(_vm(tags={"coverage": "none"}), aliases, exclusionTagName="coverage",
                       offValue="none") == set()


def test_an_opted_in_owner_is_not_modified_again(aliases: Dict[str, str]) -> None:
    opted = _vm(scheduledEventsPolicy={"scheduledEventsAdditionalPublishingTargets": {
        "eventGridAndResourceGraph": {"enable": True, "scheduledEventsApiVersion": "2020-07-01"}}})
    assert "platform-feed-opt-in" not in _covered_by(opted, aliases)
    assert "platform-feed-role" in _covered_by(opted, aliases)
