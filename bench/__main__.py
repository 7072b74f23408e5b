"""`python -m bench [name ...]`: run every bench/*.py module that defines main() (each as its own
process, one after another, since they measure timing and memory), then print one table."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

from bench import FIGURES_ENV, Figure, report, table

HERE = Path(__file__).resolve().parent


def modules() -> List[str]:
    found = []
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found.append(path.stem)
    return found


def main(argv: List[str]) -> int:
    wanted = argv or modules()
    started, clock = report.now(), time.monotonic()
    figures: List[Figure] = []
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            out = Path(tmp) / f"{name}.jsonl"
            print(f"== bench.{name}", flush=True)
            env = {**os.environ, FIGURES_ENV: str(out)}
            rc = subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=HERE.parent, env=env)
            if rc != 0:
                failed.append(name)
            if out.exists():
                figures += [Figure(**json.loads(line)) for line in out.read_text().splitlines() if line]
            else:
                figures.append(Figure(name, "exit code (no figures recorded)", rc, "", "0", rc == 0))
    print("\n" + table(figures))
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    # The results file (README links it) is written only for a full run, never from a partial one.
    if not argv:
        path = report.write(figures, failed, started, time.monotonic() - clock)
        print(f"\nwritten: {path.relative_to(HERE.parent)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
