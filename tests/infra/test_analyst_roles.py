"""Analysts' roles (issue 26): infra/app/roles.bicep gives each of main.bicep's `analystPrincipalIds`
Storage Blob Data Reader on the Capture container (only when Capture is on) and Azure Event Hubs Data
Receiver on the hub, with the built-in role ids Microsoft documents; docs say what the hub scope allows."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLES = (REPO / "infra" / "app" / "roles.bicep").read_text()
MAIN = (REPO / "infra" / "main.bicep").read_text()
BUILTIN = REPO.parent / "shared" / "bicep-types" / "builtin-roles.json"  # beside the checkout, as CI lays it
# Microsoft's built-in role ids (azure-docs built-in-roles.md), constants in every tenant
KNOWN = {"blobDataReader": ("2a2b9908-6ea1-4ae2-8e65-a410df84e7d1", "Storage Blob Data Reader"),
         "eventHubsDataReceiver": ("a638d3c7-ab3a-418d-83e6-5f17a39d4fde", "Azure Event Hubs Data Receiver")}


def _resource(name: str) -> str:
    match = re.search(rf"^resource {name} .*?^}}\]?$", ROLES, re.M | re.S)
    assert match, f"no resource {name} in roles.bicep"
    return match.group(0)


def test_role_ids_are_the_builtin_ones() -> None:
    for key, (role_id, name) in KNOWN.items():
        assert re.search(rf"{key}: '{role_id}' // {re.escape(name)}", ROLES), key


@pytest.mark.skipif(not BUILTIN.exists(), reason="the reference built-in roles list is not on this machine")
def test_role_ids_match_the_reference_list() -> None:
    roles = json.loads(BUILTIN.read_text())["roles"]
    for role_id, name in KNOWN.values():
        assert roles[role_id]["roleName"] == name


def test_analysts_read_the_capture_container_only_when_capture_is_on() -> None:
    block = _resource("analystCapture")
    assert "for principalId in (captureEnabled ? analystPrincipalIds : [])" in block
    assert "scope: captureContainer" in block and "roles.blobDataReader" in block
    assert re.search(r"resource captureContainer '[^']+containers@[^']+' existing", ROLES)


def test_analysts_receive_on_the_hub() -> None:
    block = _resource("analystHub")
    assert "for principalId in analystPrincipalIds" in block
    assert "scope: hub" in block and "roles.eventHubsDataReceiver" in block


def test_main_passes_the_parameter_and_the_docs_explain_the_hub_scope() -> None:
    assert "param analystPrincipalIds array = []" in MAIN
    assert "analystPrincipalIds: analystPrincipalIds" in MAIN
    analytics = (REPO / "docs" / "analytics.md").read_text()
    assert "cannot be scoped to a consumer group" in analytics
    assert "The Capture files are the analysts' default path" in analytics
    assert "`analystPrincipalIds`" in (REPO / "docs" / "deploy.md").read_text()
