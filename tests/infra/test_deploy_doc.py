"""docs/deploy.md holds to the code where it can be checked offline: both paths run the policy check
before provisioning, the az path uses the parameter form its stated Azure CLI version supports, the
install commands it shows use only options and targets the script accepts, and the prerequisites and
limits the issue asked for are stated.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "deploy.md").read_text()
SCRIPT = (REPO / "infra" / "forwarder" / "install-on-vms.sh").read_text()


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end != -1 else len(DOC)]


def test_the_az_path_checks_the_policy_before_deploying() -> None:
    path = _section("Path 2: az CLI, end to end")
    assert path.index("infra/hooks/preprovision.sh") < path.index("az deployment sub create")
    assert "--parameters infra/main.bicepparam" in path
    assert "--template-file" not in path  # the .bicepparam's `using` names the template


def test_the_stated_cli_version_supports_the_override_form() -> None:
    # `--parameters file.bicepparam name=value` in one argument: Azure CLI 2.61.0 (release notes).
    assert "≥ 2.61.0" in _section("Before you start")
    assert "--parameters infra/main.bicepparam eventHubPartitionCount=8" in DOC


def test_the_azd_path_includes_the_policy() -> None:
    path = _section("Path 1: azd, end to end")
    assert "infra/policy.json" in path and "se-policy check" in path and "azd up" in path


def test_prerequisites_and_rights_are_stated() -> None:
    before = _section("Before you start")
    for needed in ("Azure Functions Core Tools", "Azure Developer CLI", "se-policy", "Rights to provision"):
        assert needed in before, needed
    install = _section("Install the forwarder")
    assert "Rights to run it" in install and "Managed Identity Operator" in install
    assert "Uniform" in install and "Flexible" in install


def test_install_commands_use_only_what_the_script_accepts() -> None:
    options = set(re.findall(r"^\s+(-[a-z]\|--[a-z-]+|--[a-z-]+)\)", SCRIPT, re.MULTILINE))
    accepted = {o for alternatives in options for o in alternatives.split("|")}
    lines = [line for line in DOC.splitlines()
             if "install-on-vms.sh" in line and line.lstrip().startswith("infra/")]
    assert lines, "the doc shows no install command"
    for line in lines:
        words = line.split("#")[0].split()[1:]
        for word in words:
            if word.startswith("-"):
                assert word in accepted, (word, line)
            elif ":" in word:
                assert word.split(":")[0] in ("vm", "vmss", "avset"), line


def test_windows_says_what_has_run_and_what_has_not() -> None:
    """The Windows install runs under Wine (tests/vm_windows); PowerShell itself never runs here."""
    windows = _section("Windows: a startup task + a small service host")
    assert "What has run: tests/vm_windows" in windows and "What has not: PowerShell itself" in windows
    assert "must be on the image" not in DOC  # the bundle carries its own interpreter


def test_provision_again_gives_the_one_command_and_what_outlives_the_group() -> None:
    again = _section("Provision again after deleting (Key Vault)")
    assert "az keyvault recover --name" in again and "SE_KEY_VAULT_SUFFIX" in again
    assert "custom role definition" in again
    bicepparam = (REPO / "infra" / "main.bicepparam").read_text()
    assert "readEnvironmentVariable('SE_KEY_VAULT_SUFFIX', '')" in bicepparam
