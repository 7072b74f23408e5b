"""The results file of `python -m bench`: one markdown table of every figure, with the machine and date.

`write(figures, failed, path)` writes `bench/results/latest.md` (the README links it). It also lists
any figure named in the issues that no benchmark recorded (`EXPECTED`), so a missing one is visible.
Not a benchmark itself (no `main`), so `python -m bench` does not run it as one.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from bench import Figure

RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"

# (issue, benchmark module, a substring of the figure's name) for every figure the issues ask for.
EXPECTED: Tuple[Tuple[str, str, str], ...] = (
    ("2", "forwarder_latency", "change->outbox median"),
    ("2", "forwarder_latency", "change->outbox p99"),
    ("2", "forwarder_footprint", "RSS, steady"),
    ("2", "forwarder_footprint", "CPU"),
    ("3", "forwarder_eventhub_latency", "publish throughput"),
    ("3", "forwarder_eventhub_latency", "change->consumer median"),
    ("3", "forwarder_eventhub_latency", "change->consumer p99"),
    ("4", "central_throughput", "envelopes/s"),
    ("4", "central_throughput", "round trips"),
    ("5", "approval_loop", "approval POST median"),
    ("5", "approval_loop", "approval POST p99"),
    ("5", "approval_loop", "idle queue transactions per VM-hour"),
    ("7", "fleet_scale", "1000 VMs: sustained envelopes/s"),
    ("7", "fleet_scale", "1000 VMs: queue transactions/hour"),
    ("7", "fleet_scale", "1000 VMs: central CPU per fleet-hour"),
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> Dict[str, str]:
    import psutil

    physical = psutil.cpu_count(logical=False) or "?"
    return {
        "CPU model": _cpu_model(),
        "cores": f"{psutil.cpu_count(logical=True)} logical ({physical} physical)",
        "RAM": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "OS": f"{platform.system()} {platform.release()}",
        "load average at the end (1/5/15 min)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10, cwd=Path(__file__).resolve().parent, check=False)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def missing(figures: Sequence[Figure]) -> List[Tuple[str, str, str]]:
    return [e for e in EXPECTED if not any(f.bench == e[1] and e[2] in f.name for f in figures)]


def _value(v: float) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:,.3f}".rstrip("0").rstrip(".")
    return f"{int(v):,}" if isinstance(v, (int, float)) else str(v)


def markdown(figures: Sequence[Figure], failed: Sequence[str], started: datetime, seconds: float,
             command: str) -> str:
    lines = ["# Benchmark results (latest run)", "",
             f"- Date: {started.strftime('%Y-%m-%d %H:%M UTC')} (took {seconds / 60:.1f} min)",
             f"- Command: `{command}` (from the repository root; `make bench` runs `python -m bench`)",
             f"- Commit: {_commit()}"]
    lines += [f"- {k}: {v}" for k, v in machine().items()]
    lines += ["", "Every process (servers, forwarders, central) ran on this machine, shared with other work. "
              "Each value is the median of the runs, with their range [min-max] and the run count; a goal "
              "is judged on the median.", "",
              "| benchmark | figure | median | [min-max] | runs | unit | goal | met |",
              "|---|---|---:|---|---:|---|---|---|"]
    for f in figures:
        met = "" if f.met is None else ("yes" if f.met else "**NO**")
        span = f"[{_value(f.low)}-{_value(f.high)}]" if f.low is not None and f.high is not None else ""
        lines.append(f"| {f.bench} | {f.name} | {_value(f.value)} | {span} | {f.runs} | {f.unit} | {f.goal} "
                     f"| {met} |")
    gaps = missing(figures)
    lines += ["", "## Figures named in the issues", ""]
    if gaps:
        lines += ["Not recorded in this run:"] + [f"- issue {i}: `{b}` {n}" for i, b, n in gaps]
    else:
        lines.append("Every figure the issues name is in the table above.")
    if failed:
        lines += ["", "## Failed benchmarks", ""]
        lines += [f"- `python -m bench.{name}` exited non-zero" for name in failed]
    lines += ["", "Reproduce one figure: `.venv/bin/python -m bench.<benchmark>` (each prints its own "
              "figures; options in the module's docstring). See docs/faults-and-benchmarks.md.", ""]
    return "\n".join(lines)


def write(figures: Sequence[Figure], failed: Sequence[str], started: datetime, seconds: float,
          path: Path = RESULTS, command: str = "python -m bench") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(figures, failed, started, seconds, command), encoding="utf-8")
    return path


def now() -> datetime:
    return datetime.now(timezone.utc)


if __name__ == "__main__":  # the machine block alone: `python -m bench.report`
    sys.stdout.write("\n".join(f"{k}: {v}" for k, v in machine().items()) + "\n")
