"""tools/policy_reference.py: the reference cache filled from real git repositories (made here, in the
layout of Azure/bicep-types-az and maciejporebski/azure-policy-aliases): types.json copied with an index of
their resource types, alias tables read back; a missing path is one line and exit 3."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tools import policy_reference


def _repo(root: Path, files: dict) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "data"], check=True)
    return root / ".git"


def _types(name: str) -> str:
    return json.dumps([{"$type": "StringType"},
                       {"$type": "ResourceType", "name": name, "body": {"$ref": "#/0"}}])


def test_fill_copies_types_and_aliases_and_says_what_is_missing(tmp_path: Path) -> None:
    types = _repo(tmp_path / "types", {p: _types(f"Microsoft.X/{i}@2025-03-01")
                                       for i, p in enumerate(policy_reference.TYPES_FILES)})
    tables = {policy_reference.alias_file(t): f"# {t}\n\n| Default Path | Alias |\n|---|---|\n"
              f"| `properties.a` | `{t}/a` |\n" for t in policy_reference.ALIAS_TYPES}
    aliases = _repo(tmp_path / "aliases", tables)
    cache = tmp_path / "cache"
    assert policy_reference.missing(cache)
    assert policy_reference.main(["fill", "--types-git", str(types), "--aliases-git", str(aliases),
                                  str(cache)]) == 0
    assert policy_reference.missing(cache) == set()
    index = json.loads((cache / "bicep-types" / "index.json").read_text())["resources"]
    assert sorted(index) == ["Microsoft.X/0@2025-03-01", "Microsoft.X/1@2025-03-01"]
    assert index["Microsoft.X/0@2025-03-01"]["$ref"].endswith("types.json#/1")
    loaded = policy_reference.load_aliases(cache)
    assert loaded["microsoft.compute/virtualmachines/a"] == "properties.a"
    assert "at " in (cache / "SOURCE.md").read_text()


def test_a_repository_without_the_files_is_one_line(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    empty = _repo(tmp_path / "empty", {"README.md": "x"})
    assert policy_reference.main(["fill", "--types-git", str(empty), "--aliases-git", str(empty),
                                  str(tmp_path / "cache")]) == 3
    assert capsys.readouterr().err.startswith("policy_reference: git could not read")
