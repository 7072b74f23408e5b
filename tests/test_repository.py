"""Repository-level promises: the fixed layout, Python 3.9 support of the forwarder, README truths."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOP_LEVEL = ["forwarder", "function_app.py", "infra", "schemas", "tests", "host.json", "requirements.txt",
             "README.md", "Makefile", ".ci/run", "pyproject.toml", "package.json", "package-lock.json"]


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_layout_entry_exists(name: str) -> None:
    assert (REPO / name).exists(), f"{name} is part of the fixed layout"


def _python39() -> str | None:
    """A working Python 3.9: pyenv's real binary first (its shim may point at no version)."""
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates = sorted(str(p) for p in pyenv.glob("3.9*/bin/python3.9")) if pyenv.is_dir() else []
    found = shutil.which("python3.9")
    for candidate in [*reversed(candidates), *([found] if found else [])]:
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and "(3, 9)" in probe.stdout:
            return candidate
    return None


def test_forwarder_and_schemas_compile_on_python39() -> None:
    """VMs run their distro's Python: the forwarder package must at least parse and compile on 3.9."""
    python39 = _python39()
    if python39 is None:
        pytest.skip("no Python 3.9 interpreter on this machine (ruff's py39 target still checks syntax)")
    sources = [str(p) for d in ("forwarder", "schemas") for p in (REPO / d).rglob("*.py")]
    code = ("import ast,sys\nfor f in sys.argv[1:]:\n"
            "    compile(open(f).read(), f, 'exec', flags=ast.PyCF_ONLY_AST)\n")
    result = subprocess.run([python39, "-c", code, *sources], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    assert "make test" in ci
    assert "make test" in readme and "make demo" in readme


def test_readme_settings_table_is_generated_from_the_sources() -> None:
    """README's one settings table equals what forwarder/config.py and central/app_settings.json say.

    Regenerate with `python -m tools.settings_table --write`.
    """
    from tools.settings_table import block

    readme = (REPO / "README.md").read_text()
    assert block() in readme, "README.md settings table is stale: run python -m tools.settings_table --write"
