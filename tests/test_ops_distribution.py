"""The operators' distribution (ops/pyproject.toml) built and installed as an operator would, NOT
editable: the editable install in .venv finds every module in the work tree, so a package missing from
ops/pyproject.toml's list would pass every other test and fail on an operator's machine.

The wheel is built from a copy of the sources (the work tree stays clean) and installed with no
dependencies into a scratch venv that sees .venv's third-party packages through a plain path entry
(never .venv's editable finders). The console scripts then run from a folder with no sources in it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(args: list, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False)


def test_ops_wheel_ships_every_package_its_scripts_need(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO / "central", src / "central", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "schemas", src / "schemas", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "ops").mkdir()
    shutil.copy(REPO / "ops" / "pyproject.toml", src / "ops" / "pyproject.toml")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    built = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                  "--wheel-dir", str(tmp_path / "dist"), str(src / "ops")], tmp_path, env)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("scheduled_events_operator-*.whl"))

    scratch = tmp_path / "venv"
    venv.create(scratch, with_pip=False)
    scratch_python = scratch / "bin" / "python"
    probe = _run([str(scratch_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                 tmp_path, env)
    purelib = probe.stdout.strip()
    assert probe.returncode == 0 and Path(purelib).is_absolute(), probe.stderr
    # .venv's libraries (jsonschema, azure-data-tables...) as a plain path: its .pth files stay unread
    Path(purelib, "dev-libraries.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = _run([sys.executable, "-m", "pip", "--python", str(scratch_python), "install", "--quiet",
                      "--no-deps", "--no-index", str(wheel)], tmp_path, env)
    assert installed.returncode == 0, installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([str(scratch_python), "-c", "import central.cli.se_policy as m; print(m.__file__)"],
                 elsewhere, env)
    assert where.stdout.strip().startswith(purelib), (where.stdout, where.stderr)

    policy = REPO / "schemas" / "examples" / "policy" / "windows-and-budgets.json"
    check = _run([str(scratch / "bin" / "se-policy"), "check", str(policy)], elsewhere, env)
    assert check.returncode == 0, check.stdout + check.stderr
    fleet = _run([str(scratch / "bin" / "se-fleet"), "--help"], elsewhere, env)
    assert fleet.returncode == 0 and "status" in fleet.stdout, fleet.stdout + fleet.stderr
    # se-attest needs the shipped intermediates (package data): a real G2 document verifies offline
    g2 = REPO.parent / "shared" / "reference" / "attested" / "docs" / "tc-2026-07-28-eastus-g2ocsp02.json"
    attest = _run([str(scratch / "bin" / "se-attest"), str(g2), "--at", "2026-07-28T13:30:00Z", "--offline"],
                  elsewhere, env)
    assert attest.returncode == 0 and "shipped  Microsoft TLS G2 RSA CA OCSP 02" in attest.stdout, \
        attest.stdout + attest.stderr
    for package in sorted(p.parent.name for p in (REPO / "central").glob("*/__init__.py")):
        probe = _run([str(scratch_python), "-c", f"import central.{package}"], elsewhere, env)
        assert probe.returncode == 0, f"central.{package} is not in the ops wheel: {probe.stderr[-300:]}"
