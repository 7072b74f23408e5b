"""Repository-level promises: the fixed layout, Python 3.9 support of the forwarder, README truths."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOP_LEVEL = ["forwarder", "function_app.py", "infra", "schemas", "tests", "host.json", "requirements.txt",
             "README.md", "Makefile", ".ci/run", "pyproject.toml", "package.json", "package-lock.json"]


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_layout_entry_exists(name: str) -> None:
    assert (REPO / name).exists(), f"{name} is part of the fixed layout"


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


def test_every_relative_link_in_the_docs_exists() -> None:
    import re

    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.name} links to a missing {target}"
