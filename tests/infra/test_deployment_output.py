"""infra/forwarder/deployment-output.sh finds the forwarder bundles' storage account from the deployment's
outputs, on names that collide: the main account is stse<token>, the artifacts account stsea<token>, so when
<token> starts with "a" both start with "stsea" and the prefix query docs/deploy.md used to give picks the
main one. The real script runs in real bash against `az` stubbed by tests/infra/stub_cli.py (recorded
answers, --query applied with jmespath as az does)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import jmespath
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "forwarder" / "deployment-output.sh"
STUB = Path(__file__).resolve().parent / "stub_cli.py"
RECORDINGS = Path(__file__).resolve().parent / "recordings"
TOKEN = "abcd2efgh3ijk"  # uniqueString() output starting with "a": the collision
MAIN, ARTIFACTS = f"stse{TOKEN}", f"stsea{TOKEN}"
OLD_QUERY = "[?starts_with(name, 'stsea')].name | [0]"  # docs/deploy.md's path 2 before issue 26

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _deployment() -> Dict[str, Any]:
    newest = sorted(json.loads((RECORDINGS / "deployment-sub-list.json").read_text()),
                    key=lambda d: d["properties"]["timestamp"])[-1]
    d = copy.deepcopy(newest)
    outputs = d["properties"]["outputs"]
    outputs["STORAGE_ACCOUNT_NAME"]["value"] = MAIN
    outputs.pop("ARTIFACTS_STORAGE_ACCOUNT_NAME", None)
    outputs["artifactS_STORAGE_ACCOUNT_NAME"] = {"type": "String", "value": ARTIFACTS}  # ARM's odd casing
    return d


def _run(tmp_path: Path, args: List[str], deployments: List[Dict[str, Any]]) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "az").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" az "$@"\n')
    (bin_dir / "az").chmod(0o755)
    entries: List[Dict[str, Any]] = [{"command": "deployment sub list", "result": deployments}]
    entries += [{"command": "deployment sub show", "options": {"--name": d["name"]}, "result": d}
                for d in deployments]
    entries.append({"command": "deployment sub show", "exit": 3,
                    "error": "(DeploymentNotFound) Deployment could not be found."})
    world = tmp_path / "world.json"
    world.write_text(json.dumps({"az": entries}))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "STUB_WORLD": str(world), "STUB_LOG": str(tmp_path / "calls.jsonl")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_the_old_prefix_query_picks_the_main_account_on_colliding_names() -> None:
    accounts = [{"name": MAIN}, {"name": ARTIFACTS}]  # az storage account list: by name
    assert jmespath.search(OLD_QUERY, accounts) == MAIN  # the bug this script replaces


def test_the_artifacts_account_from_the_environments_newest_deployment(tmp_path: Path) -> None:
    deployment = _deployment()
    env_name = deployment["properties"]["parameters"]["environmentName"]["value"]
    result = _run(tmp_path, ["-e", env_name, "ARTIFACTS_STORAGE_ACCOUNT_NAME"], [deployment])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{ARTIFACTS}\n"
    main = _run(tmp_path, ["-d", deployment["name"], "storage_account_name"], [deployment])
    assert main.stdout == f"{MAIN}\n"


def test_a_missing_output_or_deployment_is_one_line_exit_3(tmp_path: Path) -> None:
    deployment = _deployment()
    missing = _run(tmp_path, ["-d", deployment["name"], "NO_SUCH_OUTPUT"], [deployment])
    assert missing.returncode == 3 and missing.stderr.count("\n") == 1
    assert "no output NO_SUCH_OUTPUT" in missing.stderr
    gone = _run(tmp_path, ["-d", "nope", "ARTIFACTS_STORAGE_ACCOUNT_NAME"], [deployment])
    assert gone.returncode == 3 and "cannot read the outputs" in gone.stderr
    usage = _run(tmp_path, [], [deployment])
    assert usage.returncode == 2 and "give the output's name" in usage.stderr


def test_deploy_md_path_2_uses_the_script_not_a_prefix_match() -> None:
    text = (REPO / "docs" / "deploy.md").read_text()
    assert "starts_with(name, 'stsea')" not in text
    assert "infra/forwarder/deployment-output.sh ARTIFACTS_STORAGE_ACCOUNT_NAME" in text
