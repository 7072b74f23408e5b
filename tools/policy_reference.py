"""The reference data that infra/coverage/ (Azure Policy) is checked against, kept in a cache outside the
repository (never copied in), filled from public snapshots:

- bicep-types/: Microsoft.Authorization policyDefinitions, policySetDefinitions and policyAssignments, and
  Microsoft.Resources/deployments (Azure/bicep-types-az `generated/.../types.json`: TYPES_FILES, the data
  the Bicep compiler uses), with an index.json in the format of ../shared/bicep-types (tools/bicep_types.py
  reads both);
- aliases/: Azure Policy alias tables for the resource types the rules read (maciejporebski/
  azure-policy-aliases `aliases/<Namespace>/<type>.md`, refreshed daily there from Get-AzPolicyAlias);
- SOURCE.md: the repositories and commits.

`python -m tools.policy_reference fill --types-git DIR --aliases-git DIR [CACHE]` fills it from git
directories of those repositories (e.g. the search tool's `fetch`). Tests read it from `cache_dir()`
and are skipped, naming this command as the reason, when it is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set

POLICY_API_VERSION = "2025-03-01"
TYPES_FILES = (  # the policy types, and the nested deployment a DeployIfNotExists template holds
    f"generated/resources_1/microsoft.authorization/{POLICY_API_VERSION}/types.json",
    "generated/resources_7/microsoft.resources/2024-03-01/types.json",
)
ALIAS_TYPES = (
    "Microsoft.Compute/virtualMachines",
    "Microsoft.Compute/virtualMachines/extensions",
    "Microsoft.Compute/virtualMachineScaleSets",
    "Microsoft.Compute/virtualMachineScaleSets/extensions",
    "Microsoft.Compute/availabilitySets",
    "Microsoft.Authorization/roleAssignments",
)
ALIAS_ROW = re.compile(r"^\| `([^`]+)` \| `([^`]+)` \|$")


SHARED = Path(__file__).resolve().parents[2] / "shared" / "policy-reference"  # beside the checkout


def cache_dir() -> Path:
    """SE_REFERENCE_CACHE; else ../shared/policy-reference beside the checkout when it is there (where the
    shared bicep-types extract lives); else ~/.cache/se-reference."""
    configured = os.environ.get("SE_REFERENCE_CACHE")
    if configured:
        return Path(configured)
    return SHARED if SHARED.is_dir() else Path.home() / ".cache" / "se-reference"


def alias_file(resource_type: str) -> str:
    namespace, _, rest = resource_type.partition("/")
    return f"aliases/{namespace}/{rest.replace('/', '-')}.md"


def load_aliases(cache: Path) -> Dict[str, str]:
    """Every alias of the cached types (lower case) -> its default path (e.g. properties.publisher)."""
    aliases: Dict[str, str] = {}
    for resource_type in ALIAS_TYPES:
        path = cache / alias_file(resource_type)
        for line in path.read_text().splitlines():
            match = ALIAS_ROW.match(line.strip())
            if match:
                aliases[match.group(2).lower()] = match.group(1)
    return aliases


def _git_show(git_dir: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
                          check=True, capture_output=True).stdout


def _head(git_dir: Path) -> str:
    out = subprocess.run(["git", "--git-dir", str(git_dir), "log", "-1", "--format=%H %cs"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip()


def fill(cache: Path, types_git: Path, aliases_git: Path) -> List[str]:
    """Copies the data in; returns the resource types (type@version) the index lists."""
    types_commit, aliases_commit = _head(types_git), _head(aliases_git)
    index: Dict[str, Dict[str, str]] = {}
    for path in TYPES_FILES:
        rel = path.removeprefix("generated/")
        raw = _git_show(types_git, types_commit.split()[0], path)
        target = cache / "bicep-types" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(raw)
        index.update({t["name"]: {"$ref": f"{rel}#/{i}"} for i, t in enumerate(json.loads(raw))
                      if t.get("$type") == "ResourceType"})
    (cache / "bicep-types" / "index.json").write_text(json.dumps({"resources": index}, indent=1))
    for resource_type in ALIAS_TYPES:
        out = cache / alias_file(resource_type)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(_git_show(aliases_git, aliases_commit.split()[0], alias_file(resource_type)))
    (cache / "SOURCE.md").write_text(
        "# Reference data for infra/coverage/ (not the project's; never copy it into the repository)\n"
        f"- bicep-types/: Azure/bicep-types-az (MIT) {', '.join(TYPES_FILES)} at {types_commit}\n"
        f"- aliases/: maciejporebski/azure-policy-aliases {', '.join(map(alias_file, ALIAS_TYPES))} "
        f"at {aliases_commit} (Get-AzPolicyAlias output)\n")
    return sorted(index)


def missing(cache: Path) -> Set[str]:
    """What the tests need and the cache lacks (empty: complete)."""
    wanted = {"bicep-types/index.json", *map(alias_file, ALIAS_TYPES)}
    return {name for name in wanted if not (cache / name).is_file()}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.policy_reference")
    sub = parser.add_subparsers(dest="command", required=True)
    fill_cmd = sub.add_parser("fill", help="copy the reference data from git directories into the cache")
    fill_cmd.add_argument("--types-git", type=Path, required=True, help="git dir of Azure/bicep-types-az")
    fill_cmd.add_argument("--aliases-git", type=Path, required=True,
                          help="git dir of maciejporebski/azure-policy-aliases")
    fill_cmd.add_argument("cache", nargs="?", type=Path, default=None)
    args = parser.parse_args(argv)
    cache = args.cache or cache_dir()
    try:
        listed = fill(cache, args.types_git, args.aliases_git)
    except subprocess.CalledProcessError as error:
        print(f"policy_reference: git could not read {error.cmd[-1]}: {error.stderr.decode().strip()}",
              file=sys.stderr)
        return 3
    print(f"{cache}: {', '.join(listed)}; aliases of {len(ALIAS_TYPES)} types")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
