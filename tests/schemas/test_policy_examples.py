"""Every example policy in the repository passes `se-policy check` (warnings allowed, no errors):
schemas/examples/policy/, the JSON policies in README.md and docs/, infra/*policy*.json (a deployment
input), and the demo's policy."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest

import schemas
from central.cli import se_policy as policy_cli

REPO = Path(__file__).resolve().parents[2]
POLICY_KEYS = set(schemas.load("policy.schema.json")["properties"])


def _looks_like_policy(doc: Any) -> bool:
    return isinstance(doc, dict) and "version" in doc and set(doc) <= POLICY_KEYS and len(doc) > 1


def _doc_blocks() -> Iterator[Tuple[str, str]]:
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for n, block in enumerate(re.findall(r"```json\n(.*?)```", page.read_text(encoding="utf-8"), re.S)):
            try:
                doc = json.loads(block)
            except ValueError:
                continue  # a fragment, not a document
            if _looks_like_policy(doc):
                yield f"{page.relative_to(REPO)}#{n}", block


FILES: List[Path] = sorted((REPO / "schemas" / "examples" / "policy").glob("*.json")) + sorted(
    p for p in (REPO / "infra").rglob("*.json") if "policy" in p.name.lower()
)
BLOCKS = list(_doc_blocks())


def test_there_are_examples_in_files_and_docs() -> None:
    assert len(FILES) >= 3 and BLOCKS, "the example policies went missing"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_example_policy_file_passes_check(path: Path) -> None:
    out = io.StringIO()
    code = policy_cli.main(["check", str(path)], out=out)
    assert code == 0, out.getvalue()


@pytest.mark.parametrize("where, text", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_policy_in_the_docs_passes_check(where: str, text: str) -> None:
    errors = [f for f in policy_cli.check_text(text) if f.severity == "error"]
    assert errors == [], where


def test_the_demo_policy_passes_check() -> None:
    from sandbox.demo.fleet import POLICY

    errors = [f for f in policy_cli.check_text(json.dumps(POLICY)) if f.severity == "error"]
    assert errors == []
