"""infra/coverage/remediate.sh in real bash against a stub az (tests/infra/stub_cli.py): one remediation
task per policy of the initiative, for the reference ids Azure holds, at a subscription or a management
group; a missing assignment or bad usage is one actionable line and its own exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "coverage" / "remediate.sh"
STUB = Path(__file__).resolve().parent / "stub_cli.py"
SUB = "0b5f2a9e-6c1d-4e8f-9a7b-3c2d1e0f4a5b"
REFS = [r["policyDefinitionReferenceId"]
        for r in json.loads((REPO / "infra/coverage/initiative.json").read_text())["policyDefinitions"]]


def _world(assigned: bool = True) -> Dict[str, Any]:
    show: Dict[str, Any] = {"command": "policy assignment show",
                            "result": {"policyDefinitionId": f"/subscriptions/{SUB}/providers/Microsoft."
                                                             "Authorization/policySetDefinitions/se-coverage"}}
    if not assigned:
        show = {"command": "policy assignment show", "error": "(PolicyAssignmentNotFound) not found",
                "exit": 3}
    return {"az": [
        {"command": "account show", "result": {"id": SUB}},
        show,
        {"command": "policy set-definition show",
         "result": {"policyDefinitions": [{"policyDefinitionReferenceId": r} for r in REFS]}},
        {"command": "policy remediation create", "result": None},
    ]}


def _run(tmp_path: Path, world: Dict[str, Any],
         *args: str) -> Tuple[subprocess.CompletedProcess, List[List[str]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "az").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" az "$@"\n')
    (bin_dir / "az").chmod(0o755)
    (tmp_path / "world.json").write_text(json.dumps(world))
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path),
           "STUB_WORLD": str(tmp_path / "world.json"), "STUB_LOG": str(log)}
    result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env,
                            timeout=120)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


def _remediations(calls: List[List[str]]) -> List[List[str]]:
    return [c for c in calls if c[1:4] == ["policy", "remediation", "create"]]


def test_one_task_per_policy_of_the_initiative(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, _world())
    assert result.returncode == 0, result.stderr
    tasks = _remediations(calls)
    assert len(tasks) == len(REFS) == 6
    assignment = f"/subscriptions/{SUB}/providers/Microsoft.Authorization/policyAssignments/se-coverage"
    for ref, task in zip(REFS, tasks):
        assert task[task.index("--definition-reference-id") + 1] == ref
        assert task[task.index("--policy-assignment") + 1] == assignment
        assert task[task.index("--resource-discovery-mode") + 1] == "ExistingNonCompliant"
    result, calls = _run(tmp_path, _world(), "--re-evaluate")
    modes = {t[t.index("--resource-discovery-mode") + 1] for t in _remediations(calls)}
    assert modes == {"ReEvaluateCompliance"}


def test_a_management_group(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, _world(), "--management-group", "mg-prod", "--assignment", "se-cov")
    assert result.returncode == 0, result.stderr
    tasks = _remediations(calls)
    assert tasks and all(t[t.index("--management-group") + 1] == "mg-prod" for t in tasks)
    assert tasks[0][tasks[0].index("--policy-assignment") + 1] == (
        "/providers/Microsoft.Management/managementGroups/mg-prod/providers/Microsoft.Authorization/"
        "policyAssignments/se-cov")
    assert not any(c[1:3] == ["account", "show"] for c in calls)


def test_problems_are_one_line_and_an_exit_code(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, _world(assigned=False))
    assert result.returncode == 4 and not _remediations(calls)
    assert result.stderr.strip().splitlines()[-1].startswith("remediate: no policy assignment 'se-coverage'")
    result, _ = _run(tmp_path, _world(), "--bogus")
    assert result.returncode == 2 and "unknown argument" in result.stderr
    result, _ = _run(tmp_path, _world(), "--management-group", "mg", "--re-evaluate")
    assert result.returncode == 2 and "--re-evaluate is for a subscription" in result.stderr
