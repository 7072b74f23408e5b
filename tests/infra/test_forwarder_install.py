"""The forwarder's install artifacts agree with the forwarder and each other: the config keys the
Bicep writes are forwarder/config.py settings; the systemd unit is hardened and runs the console
script; the Linux install script parses (the Windows ones: test_powershell_parse.py); the bundle
names match; the wheel holds every package; the VM lock pins every runtime dependency within
pyproject's ranges.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tools import wheelhouse
from tools.bicep_settings import object_var_keys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[2]
FORWARDER_INFRA = REPO / "infra" / "forwarder"
UNIT = FORWARDER_INFRA / "se-forwarder.service"


def _unit() -> Dict[str, List[str]]:
    """Directive -> values (systemd allows repeats, so a plain INI parser would lose some)."""
    values: Dict[str, List[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        values.setdefault(key.strip(), []).append(value.strip())
    return values


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_config_keys_are_forwarder_settings() -> None:
    from forwarder.config import BY_KEY

    keys = object_var_keys(FORWARDER_INFRA / "config.bicep", "baseSettings")
    assert keys <= set(BY_KEY), keys - set(BY_KEY)
    assert {"sink", "eventhub_namespace", "eventhub_name", "client_id", "queue_service_uri",
            "state_dir"} <= keys


def test_unit_is_hardened() -> None:
    unit = _unit()
    expected = {
        "User": "se-forwarder", "Restart": "always", "StateDirectory": "se-forwarder",
        "ProtectSystem": "strict", "ProtectHome": "yes", "NoNewPrivileges": "yes", "PrivateTmp": "yes",
        "PrivateDevices": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "StartLimitIntervalSec": "0",
        "PrivateUsers": "yes", "PrivateMounts": "yes", "UMask": "0077", "IPAddressDeny": "any",
    }
    for key, value in expected.items():
        assert unit.get(key) == [value], f"{key}={unit.get(key)}"
    assert unit["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]
    assert "MemoryMax" in unit and "RestartSec" in unit and "TasksMax" in unit


def test_unit_runs_the_console_script_with_the_installed_config() -> None:
    scripts = _pyproject()["project"]["scripts"]
    (exec_start,) = _unit()["ExecStart"]
    binary = exec_start.split()[0]
    assert Path(binary).name in scripts
    assert "--config /etc/se-forwarder/config.json" in exec_start
    state = [v for v in _unit()["Environment"] if v.startswith("SE_FORWARDER_STATE_DIR=")]
    config_bicep = (FORWARDER_INFRA / "config.bicep").read_text()
    assert state == ["SE_FORWARDER_STATE_DIR=/var/lib/se-forwarder"]
    assert "'/var/lib/se-forwarder'" in config_bicep


def test_linux_install_script_parses() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash on this machine")
    result = subprocess.run([bash, "-n", str(FORWARDER_INFRA / "install-forwarder.sh")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_linux_install_script_refuses_bad_arguments() -> None:
    result = subprocess.run(["bash", str(FORWARDER_INFRA / "install-forwarder.sh"), "--bogus"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "unknown argument" in result.stderr


def test_bundle_and_script_names_agree() -> None:
    for module in ("install-vm.bicep", "install-vmss.bicep"):
        text = (FORWARDER_INFRA / module).read_text()
        for name in ("install-forwarder.sh", "se-forwarder-linux.tar.gz", "install-forwarder.ps1",
                     "se-forwarder-windows.zip"):
            assert name in text, (module, name)
    source = (REPO / "tools" / "wheelhouse.py").read_text()
    assert "se-forwarder-linux.tar.gz" in source and "se-forwarder-windows.zip" in source
    for files in wheelhouse.BUNDLE_FILES.values():
        for name in files:
            assert (FORWARDER_INFRA / name).is_file()


def test_the_wheel_holds_every_forwarder_package() -> None:
    packages = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = {p.parent.relative_to(REPO).as_posix().replace("/", ".")
             for p in (REPO / "forwarder").rglob("__init__.py")}
    assert found <= packages, f"missing from pyproject [tool.setuptools] packages: {sorted(found - packages)}"


def test_vm_lock_pins_every_dependency_within_its_range() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: Dict[str, str] = {}
    for line in wheelhouse.LOCK.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.\-]+)", line)
            assert match, f"not an exact pin: {line!r}"
            pins[canonicalize_name(match.group(1))] = match.group(2)
    for spec in _pyproject()["project"]["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned in {wheelhouse.LOCK.name}"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} outside {spec}"
