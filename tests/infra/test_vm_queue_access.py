"""Approvals are per VM (issue 14, items 3-4, infra side): a VM can receive and delete only its own
approval messages. No principal holds a role that reads queue messages at storage-account scope
without a condition; the VMs' shared identity has no queue role at all; the forwarder install gives
each VM its own system-assigned identity and Storage Queue Data Message Processor on its own queue
vm-<vmId> (a Uniform scale set: its one identity, on its instances' queues), named exactly as central
names it. Offline, on the Bicep syntax trees.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Dict, List, Optional

import tree_sitter as ts

from central.runtime.approval_queue import queue_name
from tools.bicep_check import (
    bicep_files,
    body_object,
    name_of,
    node_text,
    object_properties,
    parse,
    string_value,
    walk,
)

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
FORWARDER = INFRA / "forwarder"
# Built-in roles that read or delete queue messages (their GUIDs are global: infra/app/roles.bicep).
QUEUE_READERS = {
    "8a0f0c08-91a1-4084-bc3d-661d67233fed": "Storage Queue Data Message Processor",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "19e7f393-937e-4f77-808e-94535e297925": "Storage Queue Data Reader",
}


class Assignment:
    def __init__(self, path: Path, tree: ts.Tree, node: ts.Node) -> None:
        self.path, self.symbol = path, name_of(node)
        body = body_object(node)
        assert body is not None
        props = object_properties(body)
        inner = object_properties(props["properties"])
        self.principal = node_text(inner["principalId"])
        self.role = _resolve_guid(tree, inner["roleDefinitionId"])
        self.condition = "condition" in inner
        self.scope_type = _scope_type(tree, props["scope"]) if "scope" in props else "resourceGroup"


def _declarations(tree: ts.Tree, kind: str) -> Dict[str, ts.Node]:
    return {name_of(n) or "": n for n in tree.root_node.children if n.type == kind}


def _resolve_guid(tree: ts.Tree, expression: ts.Node) -> Optional[str]:
    """The role GUID an expression names: a literal, a var, or a key of a var object (roles.x)."""
    variables = _declarations(tree, "variable_declaration")
    for node in walk(expression):
        if node.type == "string" and string_value(node) and len(string_value(node) or "") == 36:
            return string_value(node)
        if node.type == "member_expression" and node.children[0].type == "identifier":
            base = variables.get(node_text(node.children[0]))
            if base is not None and base.children[-1].type == "object":
                value = object_properties(base.children[-1]).get(node_text(node.children[-1]))
                if value is not None:
                    return string_value(value)
        if node.type == "identifier" and node_text(node) in variables:
            value = variables[node_text(node)].children[-1]
            if value.type == "string":
                return string_value(value)
    return None


def _scope_type(tree: ts.Tree, scope: ts.Node) -> str:
    base = scope.children[0] if scope.type == "subscript_expression" else scope
    resource = _declarations(tree, "resource_declaration").get(node_text(base))
    assert resource is not None, f"scope {node_text(scope)} is not a resource of this file"
    type_string = next(string_value(c) for c in resource.children if c.type == "string")
    return (type_string or "").split("@")[0]


def _assignments() -> List[Assignment]:
    found = []
    for path in bicep_files(INFRA):
        if path.suffix != ".bicep":
            continue
        tree = parse(path)
        for node in tree.root_node.children:
            if node.type == "resource_declaration" and "roleAssignments@" in node_text(node).split("\n")[0]:
                found.append(Assignment(path, tree, node))
    return found


def test_the_assignments_are_found() -> None:
    files = {a.path.name for a in _assignments()}
    assert {"roles.bicep", "capture-access.bicep", "queue-access.bicep"} <= files


def test_no_queue_reading_role_at_account_scope_without_a_condition() -> None:
    readers = [a for a in _assignments() if a.role in QUEUE_READERS]
    assert readers, "no queue-reading role at all: the VMs could not take approvals"
    for a in readers:
        assert a.scope_type == "Microsoft.Storage/storageAccounts/queueServices/queues" or a.condition, (
            f"{a.path.name}: {a.symbol} grants {QUEUE_READERS[a.role or '']} at {a.scope_type}")


def test_the_shared_vm_identity_holds_no_queue_role_and_nothing_at_account_scope() -> None:
    shared = [a for a in _assignments() if a.principal == "vmPrincipalId"]
    assert {a.symbol for a in shared} == {"vmHubSender", "vmArtifactsReader"}
    for a in shared:
        assert a.role not in QUEUE_READERS and a.scope_type != "Microsoft.Storage/storageAccounts", a.symbol


def test_queue_access_is_one_queue_per_vm_named_as_central_names_it() -> None:
    tree = parse(FORWARDER / "queue-access.bicep")
    (queues,) = [n for n in tree.root_node.children if name_of(n) == "queues"]
    assert "name: 'vm-${toLower(vmId)}'" in node_text(queues)
    (processor,) = [a for a in _assignments() if a.path.name == "queue-access.bicep"]
    assert processor.role == "8a0f0c08-91a1-4084-bc3d-661d67233fed" and processor.principal == "principalId"
    for vm_id in (str(uuid.uuid5(uuid.NAMESPACE_DNS, "vm0")), str(uuid.uuid4()).upper(), str(uuid.uuid4())):
        assert queue_name(vm_id) == f"vm-{vm_id.lower()}"  # central's rule = the Bicep's, for a vmId


def _module(path: Path, symbol: str) -> Dict[str, str]:
    tree = parse(path)
    (node,) = [n for n in tree.root_node.children if n.type == "module_declaration" and name_of(n) == symbol]
    body = body_object(node)
    assert body is not None
    props = object_properties(body)
    params = {k: " ".join(node_text(v).split()) for k, v in object_properties(props["params"]).items()}
    params["__target__"] = next(string_value(c) for c in node.children if c.type == "string") or ""
    params["__scope__"] = node_text(props["scope"])
    return params


def test_the_vm_install_gives_the_vm_its_own_identity_and_queue() -> None:
    params = _module(FORWARDER / "install-vm.bicep", "queueAccess")
    assert params["__target__"] == "queue-access.bicep"
    assert params["principalId"] == "vm.identity.principalId"  # the VM's system-assigned identity
    assert params["vmIds"] == "[ vm.properties.vmId ]"  # its own queue, and only that one
    assert params["__scope__"].startswith("resourceGroup(split(storageAccountId, '/')[2]")


def test_a_uniform_scale_set_gets_its_instances_queues_for_its_one_identity() -> None:
    params = _module(FORWARDER / "install-vmss.bicep", "queueAccess")
    assert params["principalId"] == "vmss.identity.principalId"
    assert params["vmIds"] == "instanceVmIds"


def test_the_forwarder_starts_only_after_its_queue_role_exists() -> None:
    for name in ("install-vm.bicep", "install-vmss.bicep"):
        tree = parse(FORWARDER / name)
        extensions = [n for n in tree.root_node.children if n.type == "resource_declaration"
                      and "/extensions@" in node_text(n).split("\n")[0]]
        assert len(extensions) == 2
        for extension in extensions:
            body = body_object(extension)
            assert body is not None
            depends = object_properties(body).get("dependsOn")
            assert depends is not None and "queueAccess" in node_text(depends), (name, name_of(extension))


def test_the_config_reads_the_queue_with_the_system_assigned_identity() -> None:
    from forwarder.config import BY_KEY

    tree = parse(FORWARDER / "config.bicep")
    (base,) = [n for n in tree.root_node.children if name_of(n) == "baseSettings"]
    settings = object_properties(base.children[-1])
    assert string_value(settings["queue_client_id"]) == "" and "queue_client_id" in BY_KEY
    assert node_text(settings["client_id"]) == "vmIdentityClientId"  # the hub keeps the shared identity


def test_the_docs_say_what_each_vm_and_each_uniform_scale_set_gets() -> None:
    deploy = (REPO / "docs" / "deploy.md").read_text()
    start = deploy.index("### Approvals are per VM")
    section = deploy[start:deploy.index("\n## ", start)]
    for needed in ("system-assigned", "Uniform", "isolation is per scale set", "5,000 role assignments",
                   "run it after scale-outs"):
        assert needed.lower() in section.lower(), needed
    security = (REPO / "docs" / "security.md").read_text()
    begin = security.index("<!-- approvals-queues:begin")
    end = security.index("<!-- approvals-queues:end -->")
    subsection = security[begin:end]
    assert "What a compromised VM can still do" in security[:begin]  # inside that part of the threat model
    assert "cannot** read, peek, receive or delete another VM's" in subsection
    assert "Uniform scale set instance" in subsection
