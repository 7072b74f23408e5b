"""Parse the repository's PowerShell scripts offline with tree-sitter-powershell (no pwsh here).

A parse proves the scripts are well-formed PowerShell as the grammar reads it, nothing about how they
behave on Windows (docs/deploy.md says so). `python -m tools.powershell_check [ROOT]` prints one finding
per line and exits 1 if there is any.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator, List, Optional

import tree_sitter as ts
import tree_sitter_powershell as tsp

from tools.bicep_check import Finding

_PARSER = ts.Parser(ts.Language(tsp.language()))
_SKIP_DIRS = {".git", "node_modules", "build", "dist", "wheelhouse"}  # plus every .venv* (not ours)


def _walk(node: ts.Node) -> Iterator[ts.Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def syntax_errors(source: bytes, path: str = "<text>") -> List[Finding]:
    """Every ERROR or MISSING node of the parse, one finding each (empty: it parses)."""
    tree = _PARSER.parse(source)
    found = []
    for node in _walk(tree.root_node):
        if node.type == "ERROR" or node.is_missing:
            text = (node.text or b"").decode("utf-8", "replace")[:40]
            what = f"missing {node.type}" if node.is_missing else f"syntax error near {text!r}"
            found.append(Finding(path, node.start_point[0] + 1, what))
    return found


def powershell_files(root: Path) -> List[Path]:
    return sorted(p for p in root.rglob("*.ps1")
                  if p.is_file() and not _skipped(p.relative_to(root).parts))


def _skipped(parts: tuple) -> bool:
    """Generated or third-party trees: the virtualenvs (.venv, .venv-vm, .venv-checkov...), builds."""
    return any(part in _SKIP_DIRS or part.startswith(".venv") for part in parts)


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0] if args else ".")
    files = powershell_files(root)
    findings = [f for path in files for f in syntax_errors(path.read_bytes(), str(path))]
    for finding in findings:
        print(finding)
    print(f"{len(files)} PowerShell file(s), {len(findings)} finding(s)")
    return 1 if findings or not files else 0


if __name__ == "__main__":
    raise SystemExit(main())
