"""`python -m bench [--repeat N] [name ...]`: run every bench/*.py module that defines main() (each as its
own process, one after another, since they measure timing and memory), N times (default 3) unless the
module repeats its own runs (`REPEATS_INSIDE = True`), then print one table of medians [min-max]."""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, List

from bench import FIGURES_ENV, Figure, aggregate, report, table

HERE = Path(__file__).resolve().parent


def repeats_inside(name: str) -> bool:
    return _flag(ast.parse((HERE / f"{name}.py").read_text(encoding="utf-8")), "REPEATS_INSIDE") is True


def _flag(tree: ast.Module, name: str) -> Any:
    """A module-level `NAME = <constant>` of a bench module (None when it has none)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            return getattr(node.value, "value", None)
    return None


def modules() -> List[str]:
    """The bench modules with a main(), except diagnostics (`IN_BENCH = False`: run them by name)."""
    found = []
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if _flag(tree, "IN_BENCH") is False:
            continue
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found.append(path.stem)
    return found


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="runs per benchmark (default 3)")
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all; no results file then)")
    args = parser.parse_args(argv)
    repeat, argv = max(1, args.repeat), args.names
    wanted = argv or modules()
    started, clock = report.now(), time.monotonic()
    figures: List[Figure] = []
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            runs = 1 if repeats_inside(name) else repeat
            found: List[Figure] = []
            for run in range(1, runs + 1):
                out = Path(tmp) / f"{name}-{run}.jsonl"
                print(f"== bench.{name} (run {run} of {runs})", flush=True)
                env = {**os.environ, FIGURES_ENV: str(out)}
                rc = subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=HERE.parent, env=env)
                if rc != 0 and name not in failed:
                    failed.append(name)
                if out.exists():
                    found += [Figure(**json.loads(line)) for line in out.read_text().splitlines() if line]
                else:
                    found.append(Figure(name, "exit code (no figures recorded)", rc, "", "0", rc == 0))
            figures += aggregate(found)
    print("\n" + table(figures))
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    # The results file (README links it) is written only for a full run, never from a partial one.
    if not argv and repeat >= 3:
        path = report.write(figures, failed, started, time.monotonic() - clock,
                            command="python -m bench" + (f" --repeat {repeat}" if repeat != 3 else ""))
        print(f"\nwritten: {path.relative_to(HERE.parent)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
