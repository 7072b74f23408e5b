"""install-forwarder.sh --uninstall [--purge] on Linux: it stops and disables the service and removes what the
install put there (the unit, /opt/se-forwarder, config.json and the *.example hooks), keeping the outbox and
the hooks someone added unless --purge.

The script runs for real, under a temporary SE_FORWARDER_ROOT (every path it touches lives there), with
`systemctl`, `userdel` and `id` stubbed through PATH: they record their arguments. Why stubs: the test must
neither stop a service nor delete a user of the machine it runs on, and CI containers have no systemd. What
the stubs stand for is only "the service manager was asked to ..."; the file system effects are real.
The unit's Documentation= page is the one the install copies from the bundle, which the bundle holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from tools import wheelhouse

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "forwarder" / "install-forwarder.sh"
UNIT = REPO / "infra" / "forwarder" / "se-forwarder.service"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

_STUB = """#!/usr/bin/env bash
echo "{name} $*" >> "{log}"
{body}
"""


def _installed(root: Path) -> Dict[str, Path]:
    """A tree as install-forwarder.sh leaves it, plus an outbox with data and a hook the owner added."""
    paths = {
        "program": root / "opt/se-forwarder/venv/bin/se-forwarder",
        "doc": root / "opt/se-forwarder/forwarder.md",
        "unit": root / "etc/systemd/system/se-forwarder.service",
        "config": root / "etc/se-forwarder/config.json",
        "example": root / "etc/se-forwarder/hooks/pre-approve.d/10-drain.example",
        "example2": root / "etc/se-forwarder/hooks/post-event.d/10-log.example",
        "outbox": root / "var/lib/se-forwarder/outbox.sqlite",
    }
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    return paths


def _stubbed_env(tmp_path: Path) -> dict:
    """PATH with the recording stubs first (id -u answers 0: the script's root check passes as any user)."""
    stubs, log = tmp_path / "bin", tmp_path / "calls.log"
    stubs.mkdir(exist_ok=True)
    bodies = {"systemctl": "exit 0", "userdel": "exit 0",
              # id -u: root; id se-forwarder: the user exists
              "id": 'if [ "$1" = "-u" ]; then echo 0; fi; exit 0'}
    for name, body in bodies.items():
        stub = stubs / name
        stub.write_text(_STUB.format(name=name, log=log, body=body))
        stub.chmod(0o755)
    return {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}",
            "SE_FORWARDER_ROOT": str(tmp_path / "root")}


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--uninstall", *args], env=_stubbed_env(tmp_path),
                          capture_output=True, text=True, timeout=60)


def _calls(tmp_path: Path) -> List[str]:
    log = tmp_path / "calls.log"
    return [c for c in log.read_text().splitlines() if not c.startswith("id ")] if log.exists() else []


def test_uninstall_stops_the_service_removes_the_install_and_keeps_the_outbox(tmp_path: Path) -> None:
    root = tmp_path / "root"
    paths = _installed(root)
    custom = root / "etc/se-forwarder/hooks/pre-approve.d/20-mine"
    custom.write_text("#!/bin/sh\n")
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path)[:2] == ["systemctl disable --now se-forwarder.service", "systemctl daemon-reload"]
    assert not any(c.startswith("userdel") for c in _calls(tmp_path))
    for gone in ("program", "doc", "unit", "config", "example", "example2"):
        assert not paths[gone].exists(), gone
    assert not (root / "opt/se-forwarder").exists()
    assert not (root / "etc/se-forwarder/hooks/post-event.d").exists()  # emptied: removed
    assert paths["outbox"].read_text() == "x" and custom.exists()
    assert "kept" in result.stdout and "--purge removes them" in result.stdout


def test_uninstall_purge_removes_config_outbox_and_user(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _installed(root)
    result = _run(tmp_path, "--purge")
    assert result.returncode == 0, result.stderr
    assert not (root / "etc/se-forwarder").exists() and not (root / "var/lib/se-forwarder").exists()
    assert not (root / "opt/se-forwarder").exists()
    assert "userdel se-forwarder" in _calls(tmp_path)


def test_uninstall_twice_and_on_a_clean_machine_succeeds(tmp_path: Path) -> None:
    assert _run(tmp_path).returncode == 0  # nothing installed
    _installed(tmp_path / "root")
    assert _run(tmp_path).returncode == 0
    assert _run(tmp_path).returncode == 0


def test_purge_alone_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(SCRIPT), "--purge"], env=_stubbed_env(tmp_path), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode != 0 and "--purge goes with --uninstall" in result.stderr, result.stderr


def test_the_units_documentation_page_is_installed_from_the_bundle() -> None:
    doc = next(line.split("=", 1)[1] for line in UNIT.read_text().splitlines()
               if line.startswith("Documentation="))
    assert doc == "file:///opt/se-forwarder/forwarder.md"
    assert wheelhouse.DOC == REPO / "docs" / "forwarder.md" and wheelhouse.DOC.is_file()
    script = SCRIPT.read_text()
    assert 'cp "$workdir/forwarder.md" "$PREFIX/forwarder.md"' in script
    assert "Install on one VM by hand" in wheelhouse.DOC.read_text()
