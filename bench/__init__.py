"""Benchmarks (not tests): each `bench/<name>.py` with a `main()` prints its own figures and may
`record()` them; `python -m bench` (`make bench`) runs them all and prints one table.

Contract for a benchmark module: define `main(argv: list[str]) -> int`; call
`bench.record([Figure(...), ...])` with what it measured (written to the JSON-lines file named by
$BENCH_FIGURES when `python -m bench` runs it; a no-op when the module runs alone).
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass
from typing import Iterable, List, Optional, Sequence

FIGURES_ENV = "BENCH_FIGURES"


@dataclass
class Figure:
    bench: str            # the module, e.g. "forwarder_latency"
    name: str             # what was measured
    value: float
    unit: str
    goal: str = ""        # e.g. "<= 0.6"
    met: Optional[bool] = None


def record(figures: Iterable[Figure]) -> None:
    path = os.environ.get(FIGURES_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        for figure in figures:
            fh.write(json.dumps(asdict(figure)) + "\n")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def table(figures: List[Figure]) -> str:
    rows = [("benchmark", "figure", "value", "unit", "goal", "met")]
    for f in figures:
        met = "" if f.met is None else ("yes" if f.met else "NO")
        rows.append((f.bench, f.name, f"{f.value:.3f}" if isinstance(f.value, float) else str(f.value),
                     f.unit, f.goal, met))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
