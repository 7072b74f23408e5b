"""The compiler's warnings that can be checked offline (tools/bicep_rules.py): infra/ has none (the
project check runs them: test_bicep_project.py), and each rule is shown to catch a broken snippet.

GA API versions: every resource type of infra/ uses a stable version. scheduledQueryRules moved from
2023-03-15-preview to 2023-12-01 (GA); every property the alert rules set (displayName, description,
severity, enabled, evaluationFrequency, windowSize, scopes, criteria.allOf[query, timeAggregation,
operator, threshold, dimensions[name, operator, values], failingPeriods], autoMitigate,
actions.actionGroups) exists in that version (Azure/bicep-types-az,
generated/monitor/microsoft.insights/2023-12-01/types.md, read 2026-11-24).
"""

from __future__ import annotations

from pathlib import Path
from typing import List

from tools.bicep_check import check_tree

REPO = Path(__file__).resolve().parents[2]


def _findings(tmp_path: Path, text: str) -> List[str]:
    (tmp_path / "main.bicep").write_text(text)
    return [f.message for f in check_tree(tmp_path)]


def test_infra_uses_no_preview_api_version() -> None:
    for path in (REPO / "infra").rglob("*.bicep"):
        assert "-preview'" not in path.read_text(), path


def test_unused_param_var_and_existing_resource(tmp_path: Path) -> None:
    found = _findings(tmp_path, "param used string\nparam idle string\nvar spare = 1\n"
                      "resource kv 'Microsoft.KeyVault/vaults@2023-07-01' existing = {\n  name: 'kv'\n}\n"
                      "output o string = used\n")
    assert found == ["param 'idle' is declared but never used", "var 'spare' is declared but never used",
                     "existing resource 'kv' is declared but never used"]


def test_an_output_reading_a_secure_param_even_through_a_var(tmp_path: Path) -> None:
    found = _findings(tmp_path, "@secure()\nparam url string\nvar has = !empty(url)\n"
                      "output direct string = url\noutput derived bool = has\n")
    assert found == ["output 'direct' reads a secure value (url)",
                     "output 'derived' reads a secure value (has)"]


def test_a_plain_param_in_an_output_is_fine(tmp_path: Path) -> None:
    assert _findings(tmp_path, "@description('x')\nparam name string\noutput o string = name\n") == []


def test_unnecessary_depends_on(tmp_path: Path) -> None:
    found = _findings(tmp_path, """
resource sa 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: 'sa'
}
resource other 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: 'other'
}
resource c 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: sa
  name: 'default'
  dependsOn: [
    sa
    other
  ]
}
""")
    assert found == ["c: dependsOn 'sa' is unnecessary (the body already references it)"]


def test_preview_api_version(tmp_path: Path) -> None:
    found = _findings(tmp_path, "resource r 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {\n"
                      "  name: 'r'\n  location: 'westeurope'\n}\n")
    assert found == ["r: preview API version Microsoft.Insights/scheduledQueryRules@2023-03-15-preview; "
                     "use a GA version"]
