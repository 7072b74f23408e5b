"""Resource ordering in infra/main.bicep, offline (tools/bicep_graph.py): no module is handed an identity
before every module that assigns that identity's roles has finished. That covers Capture (its identity's
role on the container, then the hub), the Function app (Key Vault reference, deployment and host storage,
Event Hubs: roles first) and is checked for every identity the template creates. Azure's RBAC
propagation delay after that is handled as docs/deploy.md ("Ordering and RBAC propagation") says.
"""

from __future__ import annotations

from pathlib import Path

from tools.bicep_check import parse
from tools.bicep_graph import depends_on, identity_order_findings, module_graph

REPO = Path(__file__).resolve().parents[2]
MAIN = REPO / "infra" / "main.bicep"


def test_no_identity_is_used_before_its_roles_exist() -> None:
    assert identity_order_findings(parse(MAIN)) == []


def test_the_named_orderings_hold() -> None:
    graph = module_graph(parse(MAIN))
    assert depends_on(graph, "eventHubs", "captureAccess")   # Capture: role, then the hub that uses it
    assert depends_on(graph, "functionApp", "roles")         # Key Vault reference, storage, Event Hubs
    assert depends_on(graph, "captureAccess", "captureStorage")  # the container exists before its role
    assert depends_on(graph, "roles", "storage")
    assert not depends_on(graph, "captureAccess", "eventHubs")


def test_the_capture_role_is_assigned_in_its_own_module_not_after_the_hub() -> None:
    roles = (REPO / "infra" / "app" / "roles.bicep").read_text()
    access = (REPO / "infra" / "app" / "capture-access.bicep").read_text()
    assert "ba92f5b4-2d11-453d-a403-e96b0029c9fe" not in roles  # Storage Blob Data Contributor
    assert "ba92f5b4-2d11-453d-a403-e96b0029c9fe" in access
    hub = (REPO / "infra" / "app" / "eventhubs.bicep").read_text()
    assert "type: 'SystemAssigned'" not in hub  # Capture writes with the user-assigned identity


def test_a_module_that_skips_the_role_module_is_reported(tmp_path: Path) -> None:
    (tmp_path / "main.bicep").write_text("""
module ids 'ids.bicep' = {
  name: 'ids'
}
module roles 'roles.bicep' = {
  name: 'roles'
  params: {
    principalId: ids.outputs.appIdentityPrincipalId
  }
}
module app 'app.bicep' = {
  name: 'app'
  params: {
    identityId: ids.outputs.appIdentityId
  }
}
module ok 'app.bicep' = {
  name: 'ok'
  dependsOn: [
    roles
  ]
  params: {
    identityId: ids.outputs.appIdentityClientId
  }
}
""")
    problems = identity_order_findings(parse(tmp_path / "main.bicep"))
    assert problems == ["module app uses ids's appIdentity but does not wait for module roles, which "
                        "assigns that identity's roles"]


def test_depends_on_follows_output_reads_transitively(tmp_path: Path) -> None:
    (tmp_path / "main.bicep").write_text("""
module a 'a.bicep' = {
  name: 'a'
}
module b 'b.bicep' = {
  name: 'b'
  params: {
    x: a.outputs.x
  }
}
module c 'c.bicep' = {
  name: 'c'
  dependsOn: [
    b
  ]
}
""")
    graph = module_graph(parse(tmp_path / "main.bicep"))
    assert depends_on(graph, "c", "a") and not depends_on(graph, "a", "c")
