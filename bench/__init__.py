"""Benchmarks (not tests): each `bench/<name>.py` with a `main()` prints its own figures and may
`record()` them; `python -m bench` (`make bench`) runs them all and prints one table.

Contract for a benchmark module: define `main(argv: list[str]) -> int`; call
`bench.record([Figure(...), ...])` with what it measured (written to the JSON-lines file named by
$BENCH_FIGURES when `python -m bench` runs it; a no-op when the module runs alone). `python -m bench`
runs each module 3 times and records the median [min-max] of each figure, unless the module sets
`REPEATS_INSIDE = True` (it repeats its own runs and records medians with their `low`/`high`/`runs`).
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
    low: Optional[float] = None   # the range of the runs `value` is the median of
    high: Optional[float] = None
    runs: int = 1


def spread_figure(figure: Figure, values: Sequence[float]) -> Figure:
    """`figure` with its value the median of `values` and their range (a module repeating its own runs)."""
    figure.value, figure.low, figure.high, figure.runs = median(values), min(values), max(values), len(values)
    return figure


def _meets(goal: str, value: float) -> Optional[bool]:
    """A goal "<= x" / ">= x" (optionally followed by a parenthesised comment) held against a value;
    None when it is not an absolute bound (e.g. "<= 1.2 x one instance's": the runs judged it)."""
    parts = goal.split()
    if len(parts) < 2 or parts[0] not in ("<=", ">=") or (parts[2:] and not parts[2].startswith("(")):
        return None
    try:
        bound = float(parts[1].replace(",", ""))
    except ValueError:
        return None
    return value <= bound if parts[0] == "<=" else value >= bound


def aggregate(figures: Sequence[Figure]) -> List[Figure]:
    """One figure per (bench, name) from several runs of a module: the median, its range and the run count.
    A goal is judged on the median; one without a bound is met only if every run met it."""
    groups: dict = {}
    for f in figures:
        groups.setdefault((f.bench, f.name), []).append(f)
    out = []
    for (bench, name), group in groups.items():
        if len(group) == 1:
            out.append(group[0])
            continue
        values = [float(f.value) for f in group]
        first = group[0]
        value = median(values)
        met = _meets(first.goal, value)
        if met is None and any(f.met is not None for f in group):
            met = all(bool(f.met) for f in group)
        out.append(Figure(bench, name, value, first.unit, first.goal, met,
                          min(values), max(values), len(group)))
    return out


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
        value = f"{f.value:.3f}" if isinstance(f.value, float) else str(f.value)
        if f.runs > 1 and f.low is not None:
            value += f" [{f.low:.3g}-{f.high:.3g}] of {f.runs}"
        rows.append((f.bench, f.name, value, f.unit, f.goal, met))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
