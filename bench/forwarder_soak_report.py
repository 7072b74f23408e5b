"""The figures of a forwarder soak (bench.forwarder_soak): per simulated day, the flatness rules of issue 50
item 1 (PASS/FAIL each), a PNG plot and a markdown summary next to the samples file.

    python -m bench.forwarder_soak --report bench/results/forwarder-soak.jsonl

Day 0 is the warm-up (imports, the first token, the first event of each kind, the first outage: every
path's first use); "the first day" the rules compare with is day 1.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.soak_report import Sample, fmt, load, md_table, plot

MIB = 1024 * 1024
BASE_DAY = 1


def _values(samples: Sequence[Sample], key: str) -> List[float]:
    return [s[key] for s in samples if s.get(key) is not None]


def _days(samples: Sequence[Sample]) -> Dict[int, List[Sample]]:
    out: Dict[int, List[Sample]] = {}
    for s in samples:
        out.setdefault(int(s["day"]), []).append(s)
    return dict(sorted(out.items()))


def outages(samples: Sequence[Sample]) -> List[Tuple[int, int]]:
    """(first, last) sample index of each run of samples taken while Event Hubs was down."""
    runs, start = [], None
    for i, s in enumerate(samples):
        if s["outage"] and start is None:
            start = i
        elif not s["outage"] and start is not None:
            runs.append((start, i - 1))
            start = None
    if start is not None:
        runs.append((start, len(samples) - 1))
    return runs


def rules(samples: List[Sample], days: List[Sample], config: Dict[str, Any],
          records: Sequence[Sample] = ()) -> List[Tuple[str, bool, str]]:
    """(rule, passed, figures) for each flatness rule of issue 50 item 1."""
    by_day = _days(samples)
    later = {d: ss for d, ss in by_day.items() if d > BASE_DAY}
    base = by_day.get(BASE_DAY, [])
    out: List[Tuple[str, bool, str]] = []
    if not base or not later:
        return [
            (
                "enough simulated days (at least 3: warm-up, the first day, one more)",
                False,
                f"{len(by_day)} days sampled",
            )
        ]
    rss0 = statistics.median(_values(base, "rss_mib"))
    worst = max(later, key=lambda d: statistics.median(_values(later[d], "rss_mib")))
    rss_w = statistics.median(_values(later[worst], "rss_mib"))
    out.append(
        (
            "RSS within +1 MiB of the first day's median",
            rss_w <= rss0 + 1.0,
            f"day {BASE_DAY} median {rss0:.2f} MiB; highest later daily median {rss_w:.2f} MiB "
            f"(day {worst}); "
            f"max of any sample {max(_values(samples, 'rss_mib')):.2f} MiB",
        )
    )
    for key, what in (("fds", "file descriptor"), ("threads", "thread")):
        # judged on each day's median: a connection open at a sample's instant (the sink closes its idle
        # connection between heartbeats) moves the least and the most, a leaked one moves the median for good
        mid0 = statistics.median(_values(base, key))
        mids = {d: statistics.median(_values(ss, key)) for d, ss in later.items()}
        out.append(
            (
                f"no {what} added",
                all(v <= mid0 for v in mids.values()),
                f"day {BASE_DAY}: median {mid0:g} (range {min(_values(base, key)):g}-"
                f"{max(_values(base, key)):g}); later days' medians {min(mids.values()):g}-"
                f"{max(mids.values()):g}, range {min(min(_values(ss, key)) for ss in later.values()):g}-"
                f"{max(max(_values(ss, key)) for ss in later.values()):g}",
            )
        )
    ends = [r["rows_at_end"] for r in records if r.get("kind") == "outage" and r["rows_at_end"] is not None]
    floor = min(_values(base, "outbox_rows"))
    runs = outages(samples)
    missed, peaks, drains = [], [], []
    for n, (first, last) in enumerate(runs):
        end = runs[n + 1][0] if n + 1 < len(runs) else len(samples)
        peaks.append(max(_values(samples[first : last + 1], "outbox_rows") or [0]))
        after = [
            i
            for i in range(last + 1, end)
            if samples[i].get("outbox_rows") is not None and samples[i]["outbox_rows"] <= floor
        ]
        if after:  # (simulated hours, real seconds): the sender's back-off runs on the real clock
            drains.append(((samples[after[0]]["sim_s"] - samples[last]["sim_s"]) / 3600,
                           samples[after[0]]["t"] - samples[last]["t"]))
        elif end < len(samples) or n + 1 < len(runs):
            missed.append(n)
    out.append(
        (
            "the outbox back to its floor after each outage",
            bool(runs) and not missed,
            f"{len(runs)} outages; floor {floor:g} rows (day {BASE_DAY}'s least); backlog at an outage's "
            f"end {min(ends or peaks or [0]):g}-{max(ends or peaks or [0]):g} rows; back to the floor within "
            f"{max(d[0] for d in drains or [(0, 0)]):.0f} simulated hour(s) of the hub's return, "
            f"{max(d[1] for d in drains or [(0, 0)]):.0f} real seconds (sampled hourly; the sender's "
            "back-off is real time); "
            f"not back before the next outage: {missed or 'none'}",
        )
    )
    limit = 2 * int(config.get("log_max_bytes", 0))
    on_disk = max(_values(samples, "log_on_disk"))
    rotations = samples[-1]["rotations"]
    per_day = [d["log_bytes"] for d in days if d["day"] >= BASE_DAY]
    after_rotation = [s["log_written"] for s in samples if s["rotations"] >= 1]
    kept_writing = len(after_rotation) > 1 and after_rotation[-1] > after_rotation[0]
    out.append(
        (
            "logs bounded by the configured rotation",
            on_disk <= limit and rotations >= 1 and kept_writing,
            f"rotation at {limit // 2:,} bytes, one rotated file kept (bound {limit:,}); most on disk "
            f"{on_disk:,} bytes; {rotations} rotation(s); written after the rotation: "
            f"{'yes' if kept_writing else 'NO'}; log bytes per simulated day "
            f"{min(per_day or [0]):,}-{max(per_day or [0]):,}",
        )
    )
    return out


def day_rows(samples: List[Sample], days: List[Sample]) -> List[List[str]]:
    by_day = _days(samples)
    rows, hooks = [], 0
    for d in days:
        ss = by_day.get(d["day"], [])
        if not ss:
            continue
        hook_runs, hooks = d["hook_runs_total"] - hooks, d["hook_runs_total"]
        rss = _values(ss, "rss_mib")
        rows.append(
            [
                str(d["day"]),
                f"{statistics.median(rss):.2f}",
                f"{max(rss):.2f}",
                f"{min(_values(ss, 'fds')):g}-{max(_values(ss, 'fds')):g}",
                f"{min(_values(ss, 'threads')):g}-{max(_values(ss, 'threads')):g}",
                fmt(max(_values(ss, "outbox_rows") or [0]), "{:.0f}"),
                f"{max(_values(ss, 'outbox_bytes')) / 1024:.0f}",
                f"{d['log_bytes']:,}",
                str(d["polls"]),
                str(d["tokens"]),
                str(d["attested"]),
                str(d["posts"]),
                str(hook_runs),
            ]
        )
    return rows


def report(path: Path) -> int:
    records = load(path)
    config = next((r for r in records if r.get("kind") == "config"), {})
    samples = [r for r in records if r.get("kind") == "sample"]
    days = [r for r in records if r.get("kind") == "day"]
    if len(samples) < 2:
        print(f"{path}: {len(samples)} samples; nothing to report yet")
        return 1
    header = [
        "sim. day",
        "RSS median MiB",
        "RSS max MiB",
        "fds",
        "threads",
        "outbox rows max",
        "outbox KiB max",
        "log bytes",
        "polls",
        "token calls",
        "attested calls",
        "approval POSTs",
        "hook runs",
    ]
    judged = rules(samples, days, config, records)
    cpu = samples[-1]["cpu_s"] - samples[0]["cpu_s"]
    sim_days = samples[-1]["sim_s"] / 86400
    lines = [
        f"# Forwarder soak: {sim_days:.1f} simulated days at {config.get('speed', '?')}x "
        f"({samples[-1]['t'] / 60:.1f} real minutes)",
        "",
        f"Samples: `{path.name}` (hourly, simulated), plot: `{path.with_suffix('.png').name}`. "
        f"Command: `python -m bench.forwarder_soak {config.get('argv', '')}`. The clock and what it "
        "cannot speed up: the module's docstring.",
        "",
        f"Forwarder CPU: {cpu:.0f} s over the run ({cpu / max(sim_days, 1e-9):.1f} s per simulated day).",
        "",
    ]
    lines += md_table(header, day_rows(samples, days))
    lines += ["", "## Rules (day 0 is the warm-up; the first day is day 1)", ""]
    lines += [f"- **{'PASS' if ok else 'FAIL'}** {rule}: {figures}" for rule, ok, figures in judged]
    text = "\n".join(lines) + "\n"
    print(text)
    path.with_suffix(".md").write_text(text, encoding="utf-8")
    _plot(path, samples)
    return 0 if all(ok for _, ok, _ in judged) else 1


def _plot(path: Path, samples: List[Sample]) -> None:
    x = [s["sim_s"] / 86400 for s in samples]

    def col(key: str, scale: float = 1.0) -> List[Optional[float]]:
        return [None if s.get(key) is None else s[key] / scale for s in samples]

    panels: List[Tuple[str, Dict[str, Any]]] = [
        ("RSS MiB", {"RSS": col("rss_mib")}),
        ("count", {"open fds": col("fds"), "threads": col("threads")}),
        (
            "outbox rows",
            {"rows": col("outbox_rows"), "Event Hubs down": [10.0 if s["outage"] else None for s in samples]},
        ),
        ("KiB", {"outbox files": col("outbox_bytes", 1024), "log on disk": col("log_on_disk", 1024)}),
    ]
    plot(path.with_suffix(".png"), "forwarder soak", x, "simulated days", panels)
