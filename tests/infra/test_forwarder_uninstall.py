"""install-forwarder.sh --uninstall [--purge] on Linux, the cases the real-systemd test does not run:
twice, on a machine with nothing installed, `--purge` alone refused; and the unit's Documentation= page
comes from the bundle. What an uninstall and a purge leave on a real Debian 12 under systemd:
tests/vm_linux/test_lifecycle.py.

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
