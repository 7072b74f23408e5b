"""What the soaks (bench.central_soak, bench.forwarder_soak) share: samples appended to a JSON-lines file as
they are taken (a run still going, or killed, leaves usable data), figures per period (an hour for central,
a simulated day for the forwarder), the growth of a series judged after warm-up, and a small PNG plot.

Not a benchmark itself (no `main`). The plot needs matplotlib (requirements-dev.txt, pinned); it is drawn
with the Agg backend (no display).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

RESULTS = Path(__file__).resolve().parent / "results"

Sample = Dict[str, Any]


class SampleLog:
    """Samples appended one JSON line each and flushed at once."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._out = open(path, "a", encoding="utf-8")

    def add(self, sample: Sample) -> None:
        self._out.write(json.dumps(sample, sort_keys=True) + "\n")
        self._out.flush()

    def close(self) -> None:
        self._out.close()


def load(path: Path) -> List[Sample]:
    """Every whole sample in `path` (a line cut short by a kill is left out)."""
    samples = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            samples.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return samples


def periods(samples: Sequence[Sample], key: str) -> Dict[int, List[Sample]]:
    """Samples grouped by the whole period they fall in (`key`: a float, e.g. hours or simulated days)."""
    out: Dict[int, List[Sample]] = {}
    for s in samples:
        out.setdefault(int(s[key]), []).append(s)
    return dict(sorted(out.items()))


def median_of(samples: Iterable[Sample], value: Callable[[Sample], Optional[float]]) -> Optional[float]:
    values = [v for v in (value(s) for s in samples) if v is not None]
    return statistics.median(values) if values else None


def growth(
    by_period: Dict[int, List[Sample]], value: Callable[[Sample], Optional[float]], warmup: int = 1
) -> Tuple[Optional[float], Optional[float]]:
    """(median of the first period after `warmup` periods, median of the last period) of a series."""
    keys = [k for k in by_period if k >= warmup] or list(by_period)
    if not keys:
        return None, None
    return median_of(by_period[keys[0]], value), median_of(by_period[keys[-1]], value)


def plot(
    path: Path,
    title: str,
    x: Sequence[float],
    xlabel: str,
    panels: Sequence[Tuple[str, Dict[str, Sequence[Optional[float]]]]],
) -> Path:
    """One PNG, one panel per (y label, {series name: values over x})."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.4 * len(panels)), sharex=True, squeeze=False)
    for ax, (ylabel, series) in zip(axes[:, 0], panels):
        for name, values in series.items():
            pts = [(a, b) for a, b in zip(x, values) if b is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, linewidth=1)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel(xlabel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def fmt(value: Optional[float], spec: str = "{:.1f}") -> str:
    return "-" if value is None else spec.format(value)


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
