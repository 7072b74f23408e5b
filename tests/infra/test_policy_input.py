"""The policy is a deployment input: infra/policy.json (the default policy) passes `se-policy check`;
main.bicepparam reads it with loadTextContent (SE_POLICY_JSON overrides it); azd's preprovision hook
runs the check before anything is provisioned and stops on an invalid policy (the real hook script,
the real se-policy console script).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Optional

import yaml

from central.policy import document as policy
from sandbox import processes
from tools.bicep_check import node_text, parse, string_value, walk

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "infra" / "policy.json"
HOOK = REPO / "infra" / "hooks" / "preprovision.sh"
SE_POLICY = REPO / ".venv" / "bin" / "se-policy"


def _hook(env: Optional[Dict[str, str]] = None, script: Path = HOOK) -> subprocess.CompletedProcess:
    # The operator API's registration is given (infra/hooks/operator-app.sh then needs no az).
    environ = processes.minimal_env(HOME=os.environ.get("HOME", "/tmp"),
                                    SE_OPERATOR_API_CLIENT_ID="5d0c6a1e-2b3f-4c7d-8e9a-0b1c2d3e4f50")
    environ.update(env or {})
    return subprocess.run(["sh", str(script)], capture_output=True, text=True, env=environ, timeout=60)


def test_the_default_policy_file_passes_se_policy_check() -> None:
    result = subprocess.run([str(SE_POLICY), "check", str(POLICY)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid: 0 error(s), 0 warning(s)" in result.stdout


def test_the_default_policy_is_exactly_the_built_in_defaults() -> None:
    loaded = policy.load(POLICY.read_text())
    assert [r.name for r in loaded.rules] == [r.name for r in policy.DEFAULT_RULES]
    assert [r.action for r in loaded.rules] == [r.action for r in policy.DEFAULT_RULES]


def test_bicepparam_reads_the_file_and_keeps_the_override() -> None:
    tree = parse(REPO / "infra" / "main.bicepparam")
    calls = {}
    for node in walk(tree.root_node):
        if node.type == "call_expression":
            function = node_text(node.child_by_field_name("function"))
            arguments = node.child_by_field_name("arguments")
            first = next((c for c in arguments.children if c.type == "string"), None)
            calls.setdefault(function, set()).add(string_value(first) if first is not None else None)
    assert "policy.json" in calls["loadTextContent"]
    assert "SE_POLICY_JSON" in calls["readEnvironmentVariable"]
    assert (REPO / "infra" / "policy.json").is_file()


def test_azure_yaml_runs_the_check_before_provisioning() -> None:
    config = yaml.safe_load((REPO / "azure.yaml").read_text())
    hook = config["hooks"]["preprovision"]
    assert hook["posix"]["run"] == "./infra/hooks/preprovision.sh" and hook["posix"]["shell"] == "sh"
    assert hook["windows"]["run"] == "./infra/hooks/preprovision.ps1" and hook["windows"]["shell"] == "pwsh"
    for entry in hook.values():
        assert (REPO / entry["run"]).is_file()


def test_the_hook_passes_the_default_policy() -> None:
    result = _hook()
    assert result.returncode == 0, result.stderr
    assert "preprovision: policy OK" in result.stdout


def test_the_hook_stops_on_an_invalid_policy() -> None:
    bad = json.dumps({"version": 1, "rules": [{"name": "x", "action": "explode", "match": {}}]})
    result = _hook({"SE_POLICY_JSON": bad})
    assert result.returncode == 2
    assert "does not pass se-policy check" in result.stderr and "Traceback" not in result.stderr


def test_the_hook_stops_when_se_policy_is_missing(tmp_path: Path) -> None:
    copy = tmp_path / "infra" / "hooks" / "preprovision.sh"
    copy.parent.mkdir(parents=True)
    shutil.copy(HOOK, copy)
    result = _hook(script=copy)  # no .venv beside the copy, none on PATH
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and "se-policy not found" in result.stderr
