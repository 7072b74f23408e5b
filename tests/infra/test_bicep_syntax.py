"""Every .bicep and .bicepparam in infra/ parses with tree-sitter-bicep: no ERROR or MISSING node."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bicep_check import bicep_files, syntax_errors

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
FILES = bicep_files(INFRA)


def test_infra_holds_the_expected_templates() -> None:
    names = {p.relative_to(INFRA).as_posix() for p in FILES}
    for expected in ("main.bicep", "main.bicepparam", "app/function.bicep", "app/roles.bicep",
                     "forwarder/install-vm.bicep", "forwarder/install-vmss.bicep"):
        assert expected in names


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(INFRA).as_posix() for p in FILES])
def test_parses_without_errors(path: Path) -> None:
    assert syntax_errors(path) == []


def test_a_syntax_error_is_reported(tmp_path: Path) -> None:
    broken = tmp_path / "broken.bicep"
    broken.write_text("param location string\n"
                      "resource sa 'Microsoft.Storage/storageAccounts@2023-05-01' = {\n"
                      "  name: 'x'\n  location: location\n  properties: {\n    minimumTlsVersion: \n")
    errors = syntax_errors(broken)
    assert errors and all(e.path == str(broken) for e in errors)


def test_a_bicepparam_syntax_error_is_reported(tmp_path: Path) -> None:
    (tmp_path / "main.bicep").write_text("param a int\n")
    broken = tmp_path / "main.bicepparam"
    broken.write_text("using './main.bicep'\nparam a = (1 +\n")
    assert syntax_errors(broken)


def test_a_valid_bicepparam_parses(tmp_path: Path) -> None:
    good = tmp_path / "main.bicepparam"
    good.write_text("using './main.bicep'\nparam a = readEnvironmentVariable('A', 'x')\nparam b = {\n  k: [\n"
                    "    1\n  ]\n}\n")
    assert syntax_errors(good) == []
