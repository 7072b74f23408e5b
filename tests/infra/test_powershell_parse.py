"""Every PowerShell script in the repository parses with tree-sitter-powershell (pinned), offline:
no pwsh runs here, so this is the check that runs on every `make test`. It proves syntax only; the
scripts' behaviour on Windows is untested (docs/deploy.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.powershell_check import main, powershell_files, syntax_errors

REPO = Path(__file__).resolve().parents[2]
FILES = powershell_files(REPO)


def test_the_windows_scripts_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in FILES}
    assert {"infra/forwarder/install-forwarder.ps1", "infra/forwarder/run-forwarder.ps1"} <= names


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(REPO).as_posix() for p in FILES])
def test_parses_without_errors(path: Path) -> None:
    assert syntax_errors(path.read_bytes(), str(path)) == []


@pytest.mark.parametrize("snippet", [
    b"function Start-It {\n    param([string]$Name\n    Write-Host $Name\n}\n",       # unclosed param(
    b"if ($x -gt 1) {\n    'yes'\n",                                                   # unclosed block
    b"$size = (Get-Item $log).Length -gt 10MB\n",  # an upper-case multiplier: this grammar rejects it
])
def test_a_broken_snippet_is_reported(snippet: bytes) -> None:
    assert syntax_errors(snippet)


def test_cli_exit_codes(tmp_path: Path) -> None:
    assert main([str(REPO / "infra")]) == 0
    (tmp_path / "bad.ps1").write_bytes(b"if ($a {\n")
    assert main([str(tmp_path)]) == 1
    assert main([str(tmp_path / "empty")]) == 1  # no file at all is a failure, not a pass
