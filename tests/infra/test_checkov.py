"""checkov over infra/ (offline, its own venv): no failed check, no file it could not parse, every
skip justified. The gate is shown to fail on an insecure resource and on a file checkov cannot parse.

Skips (with the reason) only when .venv-checkov is missing outside make; under make (MAKELEVEL set,
`make test` builds the venv first) a missing venv is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict

import pytest

from tools import checkov_gate

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"


@pytest.fixture(scope="module")
def checkov() -> Path:
    if not checkov_gate.CHECKOV.exists():
        message = f"checkov venv missing ({checkov_gate.CHECKOV}); `make checkov-venv` builds it"
        if os.environ.get("MAKELEVEL"):
            pytest.fail(message + " and make should have built it")
        pytest.skip(message)
    return checkov_gate.CHECKOV


@pytest.fixture(scope="module")
def infra_report(checkov: Path) -> Dict[str, Any]:
    return checkov_gate.run(INFRA, checkov)


def test_infra_has_no_failed_check_and_no_parsing_error(infra_report: Dict[str, Any]) -> None:
    figures = checkov_gate.summary(infra_report)
    assert checkov_gate.problems(infra_report) == []
    assert figures["passed"] >= 25 and figures["resource_count"] >= 50, figures


def test_every_skip_has_its_comment_beside_the_resource(infra_report: Dict[str, Any]) -> None:
    skipped = infra_report["results"]["skipped_checks"]
    assert skipped, "the known skips are reported as skipped (not silently passing)"
    for check in skipped:
        source = (INFRA / check["file_path"].lstrip("/")).read_text().splitlines()
        first, last = check["file_line_range"]
        block = "\n".join(source[first - 1:last])
        assert f"checkov:skip={check['check_id']}:" in block, check["resource"]


def test_the_gate_fails_on_insecure_storage_and_on_unparsable_files(checkov: Path, tmp_path: Path) -> None:
    (tmp_path / "insecure.bicep").write_text("""
resource sa 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: 'insecure'
  location: 'westeurope'
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    allowSharedKeyAccess: true
    allowBlobPublicAccess: true
    minimumTlsVersion: 'TLS1_0'
    supportsHttpsTrafficOnly: false
  }
}
""")
    # Typed arrays are valid Bicep that checkov's parser cannot read: the file would go unscanned.
    (tmp_path / "typed.bicep").write_text("param names string[]\noutput n int = length(names)\n")
    report = checkov_gate.run(tmp_path, checkov)
    figures = checkov_gate.summary(report)
    failed_ids = {c["check_id"] for c in report["results"]["failed_checks"]}
    assert "CKV_AZURE_44" in failed_ids  # TLS 1.0
    assert figures["parsing_errors"] >= 1
    problems = checkov_gate.problems(report)
    assert any(p.startswith("FAILED CKV_AZURE_44") for p in problems)
    assert any("could not parse" in p for p in problems)


def test_a_skip_without_a_reason_is_refused() -> None:
    report = {"summary": {"failed": 0, "parsing_errors": 0}, "results": {"skipped_checks": [
        {"check_id": "CKV_AZURE_1", "resource": "r", "check_result": {"suppress_comment": "ok"}}]}}
    assert checkov_gate.problems(report) == ["skip of CKV_AZURE_1 on r has no real reason: 'ok'"]


def test_no_stale_skip_comment(infra_report: Dict[str, Any]) -> None:
    """Every `checkov:skip=` comment in infra/ matches a check checkov actually skipped there."""
    import re

    used = {(c["file_path"].lstrip("/"), c["check_id"]) for c in infra_report["results"]["skipped_checks"]}
    written = {(p.relative_to(INFRA).as_posix(), m) for p in INFRA.rglob("*.bicep")
               for m in re.findall(r"checkov:skip=([A-Z0-9_]+)", p.read_text())}
    assert written - used == set()
