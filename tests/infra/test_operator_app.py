"""infra/hooks/operator-app.sh in real sh against a stub az (tests/infra/stub_cli.py): the operator API's
app registration is created with its app roles, identifier URI and required assignment, and each listed
principal gets its app role once; a refusal from Entra is one actionable line and exit 5."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "hooks" / "operator-app.sh"
STUB = Path(__file__).resolve().parent / "stub_cli.py"
ROLES = json.loads((REPO / "infra" / "hooks" / "operator-app-roles.json").read_text())
CLIENT, SP = "7e1f3a2b-4c5d-4e6f-8a9b-0c1d2e3f4a5b", "sp-object-id-1"
OLGA, RITA, RAJ = "oid-olga", "oid-rita", "oid-raj"
GRAPH = f"https://graph.microsoft.com/v1.0/servicePrincipals/{SP}/appRoleAssignedTo"


def _world(create_error: bool = False) -> Dict[str, Any]:
    create: Dict[str, Any] = {"command": "ad app create", "result": {"appId": CLIENT}}
    if create_error:
        create = {"command": "ad app create", "error": "Insufficient privileges to complete the operation.",
                  "exit": 1}
    return {"az": [
        {"command": "ad app list", "options": {"--display-name": "se-operator-api-se-prod"}, "result": []},
        create,
        {"command": "ad app update", "result": None},
        {"command": "ad sp list", "result": []},
        {"command": "ad sp create", "result": {"id": SP}},
        {"command": "ad sp update", "result": None},
        {"command": "ad sp show", "result": {"appRoles": ROLES}},
        {"command": "rest", "options": {"--method": "GET"},
         "result": {"value": [{"principalId": RITA, "appRoleId": ROLES[1]["id"]}]}},
        {"command": "rest", "options": {"--method": "POST"}, "result": {}},
    ]}


def _run(tmp_path: Path, world: Dict[str, Any], more: Optional[Dict[str, str]] = None) -> tuple:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "az").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" az "$@"\n')
    (bin_dir / "az").chmod(0o755)
    (tmp_path / "world.json").write_text(json.dumps(world))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path),
           "STUB_WORLD": str(tmp_path / "world.json"), "STUB_LOG": str(tmp_path / "calls.jsonl"),
           "AZURE_ENV_NAME": "se-prod",
           "SE_OPERATOR_PRINCIPAL_IDS": f"{OLGA},{RAJ}", "SE_READER_PRINCIPAL_IDS": RITA, **(more or {})}
    result = subprocess.run(["sh", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    log = tmp_path / "calls.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    calls: List[List[str]] = [json.loads(line) for line in lines]
    return result, calls


def test_it_creates_the_registration_and_assigns_each_role_once(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, _world())
    assert result.returncode == 0, result.stderr
    create = next(c for c in calls if c[1:4] == ["ad", "app", "create"])
    assert create[create.index("--app-roles") + 1] == f"@{SCRIPT.parent}/operator-app-roles.json"
    assert create[create.index("--sign-in-audience") + 1] == "AzureADMyOrg"
    update = next(c for c in calls if c[1:4] == ["ad", "app", "update"])
    assert update[update.index("--identifier-uris") + 1] == f"api://{CLIENT}"
    assert any(c[1:4] == ["ad", "sp", "update"] and "appRoleAssignmentRequired=true" in c for c in calls)
    posts = [json.loads(c[c.index("--body") + 1]) for c in calls if c[1] == "rest" and "POST" in c]
    assert all(c[c.index("--uri") + 1] == GRAPH for c in calls if c[1] == "rest")
    by_id = {r["value"]: r["id"] for r in ROLES}
    assert sorted((p["principalId"], p["appRoleId"]) for p in posts) == [
        (OLGA, by_id["Operator"]), (RAJ, by_id["Operator"])], "Rita already had Reader: not assigned again"
    assert f"api://{CLIENT}" in result.stdout


def test_a_refusal_is_one_line_naming_the_right_to_ask_for(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, _world(create_error=True))
    assert result.returncode == 5
    lines = [line for line in result.stderr.splitlines() if line.startswith("operator-app:")]
    assert len(lines) == 1 and "Application Developer" in lines[0] and "SE_OPERATOR_API_CLIENT_ID" in lines[0]


def test_the_roles_file_declares_operator_and_reader_for_people_and_apps() -> None:
    assert {r["value"] for r in ROLES} == {"Operator", "Reader"}
    assert all(set(r["allowedMemberTypes"]) == {"User", "Application"} and r["isEnabled"] for r in ROLES)
    assert len({r["id"] for r in ROLES}) == 2


def test_the_console_url_becomes_a_spa_redirect_uri_once(tmp_path: Path) -> None:
    """postprovision: SE_CONSOLE_URL (infra's output) is added to the registration's SPA redirect URIs,
    keeping those already there; a second run adds nothing."""
    console = "https://se-prod-abc.azurewebsites.net/api/console/"
    world = {"az": [{"command": "ad sp list", "result": [{"id": SP}]},
                    {"command": "ad sp update", "result": None},
                    {"command": "ad app show", "result": {"spa": {"redirectUris": ["http://localhost:3000/"]}}},
                    {"command": "rest", "options": {"--method": "PATCH"}, "result": {}}]}
    env = {"SE_OPERATOR_API_CLIENT_ID": CLIENT, "SE_CONSOLE_URL": console,
           "SE_OPERATOR_PRINCIPAL_IDS": "", "SE_READER_PRINCIPAL_IDS": ""}
    result, calls = _run(tmp_path, world, env)
    assert result.returncode == 0, result.stderr
    patch = next(c for c in calls if c[1] == "rest" and "PATCH" in c)
    assert patch[patch.index("--uri") + 1] == f"https://graph.microsoft.com/v1.0/applications(appId='{CLIENT}')"
    assert json.loads(patch[patch.index("--body") + 1]) == {
        "spa": {"redirectUris": ["http://localhost:3000/", console]}}
    again = tmp_path / "again"
    again.mkdir()
    world["az"][2]["result"] = {"spa": {"redirectUris": ["http://localhost:3000/", console]}}
    result, calls = _run(again, world, env)
    assert result.returncode == 0 and not [c for c in calls if c[1] == "rest"]
