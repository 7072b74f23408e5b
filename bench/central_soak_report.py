"""The figures of a central soak's samples (bench.central_soak): per simulated hour, what grew after the first
hour and what bounds it, a PNG plot and a markdown summary next to the samples file.

    python -m bench.central_soak --report bench/results/central-soak.jsonl
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from bench.soak_report import Sample, fmt, growth, load, md_table, median_of, periods, plot

# Why each series that may grow grows, and what bounds it (read from central/; the soak names the ones that
# did grow after the first hour, with this line).
RETENTION: Dict[str, str] = {
    # no "rss_mib": a runner's memory is what the issue asks to stay flat; growth past grew()'s slack is
    # NOT EXPLAINED (exit 1) until a run shows where it goes, not excused by its caches' bounds
    "seen_ids": (
        "bounded in time: envelope ids are forgotten SEEN_SECONDS = 900 s after they are met, and at most"
        " SEEN_LIMIT = 200,000 per instance (central/runtime/service.py, cachetools' TTLCache): flat after"
        " the first 15 minutes at steady load"
    ),
    "raised_keys": (
        "bounded: RAISED_LIMIT = 10,000 alert keys (central/runtime/ingest.py, a FIFOCache), oldest dropped"
    ),
    "cached_ended": (
        "bounded: ENDED_CACHE = 5,000 ended events (central/store/event_reads.py, an LRUCache),"
        " least used dropped"
    ),
    "active_reporters": (
        "one per VM name that reported an active event (central/store/active_events.py, keyed by name):"
        " bounded by the fleet's names, reset at each full reload of the active rows"
    ),
    "deferred": "changed events of budget groups this instance did not decide in: taken at its next catch-up",
    "threads": "the runner's threads: the host's receive loops, timers and the SDKs' pools (judged flat)",
    "fds": "the runner's sockets and files: connections to the hub and Azurite (judged flat)",
    "cached_active": "the active events: bounded by the events in flight (each wave's events end)",
    "state_active": "the active events' `o:` rows: bounded by the events in flight (each wave's events end)",
    "state_alerts": "alerts owed by no event (`a:` rows), deleted once delivered",
    "cached_vms": "one per VM that reported: grows with the fleet, not with time",
    "cached_names": "one per VM name read: grows with the fleet, not with time",
    "cached_named": "one per VM name: grows with the fleet, not with time",
    "alert_etags": (
        "alert rows this instance wrote, popped when each is delivered (central/runtime/service.py)"
    ),
    "head_log_chars": "bounded: LOG_CHARS = 16,000 characters (central/store/head_log.py)",
    "head_vms_chars": "bounded: VMS_CHARS = 8,000 characters (central/store/head_log.py)",
    "state_ended": (
        "MUST grow: ended events (State `x:` rows) are kept forever, the record a late report or an operator"
        " reads (docs/central.md); one row per maintenance event, none per heartbeat"
    ),
    "state_vms": "one row per VM: grows with the fleet, not with time",
    "state_names": "one row per VM name: grows with the fleet, not with time",
    "Incarnations": (
        "MUST grow: the history log analytics reads (docs/analytics.md), day-partitioned, one row per"
        " incarnation (none per heartbeat); no retention in central: an operator's lifecycle"
    ),
    "Decisions": (
        "MUST grow: the decision history (docs/analytics.md), day-partitioned, one row per decision"
    ),
    "Alerts": "MUST grow: the alert history, day-partitioned, one row per alert raised",
    "Quarantine": (
        "refused envelopes kept as the record (central/store/held.py: nothing is deleted); the trust ones"
        " re-verified for AUTHN_HELD_DAYS; grows only with refused envelopes"
    ),
    "azurite_rss_mib": "the stand-in, not central: Azurite in memory keeps every row and queue message",
    "eventhubs_rss_mib": (
        "the stand-in, not central: the sandbox Event Hubs server has no time-based retention"
        " (docs/eventhubs-server.md), so it keeps every envelope published"
    ),
}

Value = Callable[[Sample], Optional[float]]


def _runner(i: int, key: str) -> Value:
    return lambda s: s["runners"][i].get(key) if i < len(s["runners"]) else None


def _probe(key: str, runner: Optional[int] = None) -> Value:
    """One runner's cache size (each has its own caches, and partitions move between them), or the sum
    over the runners (`runner` None, the summary table's column); None where no probe reported it."""
    def value(s: Sample) -> Optional[float]:
        runners = s["runners"] if runner is None else s["runners"][runner:runner + 1]
        found = [(r.get("probe") or {}).get(key) for r in runners]
        numbers = [v for v in found if isinstance(v, (int, float))]
        return sum(numbers) if numbers else None
    return value


def probe_errors(samples: List[Sample]) -> List[str]:
    """What the runners' probes could not read (bench/soak_probe.py records the error, never stops)."""
    return sorted({str((r.get("probe") or {})["error"]) for s in samples for r in s["runners"]
                   if "error" in (r.get("probe") or {})})


def _table(key: str) -> Value:
    return lambda s: s["tables"].get(key, 0)  # a kind with no row yet is not listed: 0


def _per_envelope(first: Sample, last: Sample, key: str) -> Optional[float]:
    """ms of `key` (CPU seconds, summed over runners) per envelope ingested between two samples."""
    done = sum(r["ingested"] for r in last["runners"]) - sum(r["ingested"] for r in first["runners"])
    if done <= 0:
        return None
    spent = sum(r[key] for r in last["runners"]) - sum(r[key] for r in first["runners"])
    return 1000 * spent / done


def series(samples: List[Sample]) -> Dict[str, Value]:
    """Every series the soak judges: per runner RSS/threads/fds, cache sizes, table rows, the stand-ins."""
    count = max((len(s["runners"]) for s in samples), default=0)
    out: Dict[str, Value] = {}
    for i in range(count):
        for key in ("rss_mib", "threads", "fds"):
            out[f"runner{i}.{key}"] = _runner(i, key)
    probe_keys = sorted(
        {k for s in samples for r in s["runners"] for k in (r.get("probe") or {}) if k not in ("t", "error")}
    )
    for i in range(count):
        for key in probe_keys:
            out[f"runner{i}.{key}"] = _probe(key, i)
    for key in sorted({k for s in samples for k in s["tables"]}):
        out[key] = _table(key)
    out["azurite_rss_mib"] = lambda s: s.get("azurite_rss_mib")
    out["eventhubs_rss_mib"] = lambda s: s.get("eventhubs_rss_mib")
    return out


def grew(first: Optional[float], last: Optional[float], name: str) -> bool:
    if first is None or last is None:
        return False
    slack = 1.0 if name.endswith("rss_mib") else 0.0  # MiB: allocator noise
    return last > first * 1.02 + slack


def cpu_rows(by_hour: Dict[int, List[Sample]]) -> Dict[int, Tuple[Optional[float], Optional[float]]]:
    return {
        h: (_per_envelope(ss[0], ss[-1], "cpu_s"), _per_envelope(ss[0], ss[-1], "invocation_cpu_s"))
        for h, ss in by_hour.items()
        if len(ss) > 1
    }


def report(path: Path, hour_seconds: float = 600.0) -> int:
    samples = [s for s in load(path) if s.get("runners")]
    if len(samples) < 2:
        print(f"{path}: {len(samples)} samples; nothing to report yet")
        return 1
    by_hour = periods(samples, "hour")
    cpu = cpu_rows(by_hour)
    judged = series(samples)
    runners = len(samples[-1]["runners"])
    header = ["sim. hour", "envelopes ingested", "CPU ms/envelope (process)", "CPU ms/envelope (invocations)"]
    header += [f"runner{i} RSS MiB" for i in range(runners)] + [
        "seen ids",
        "State x:",
        "State o:",
        "Incarnations",
        "head log chars",
    ]
    rows = []
    for h, ss in by_hour.items():
        done = sum(r["ingested"] for r in ss[-1]["runners"])
        proc_ms, inv_ms = cpu.get(h, (None, None))
        row = [str(h), str(done), fmt(proc_ms, "{:.3f}"), fmt(inv_ms, "{:.3f}")]
        row += [fmt(median_of(ss, _runner(i, "rss_mib"))) for i in range(runners)]
        row += [
            fmt(median_of(ss, judged.get(k) or _probe(k)), "{:.0f}")
            for k in ("seen_ids", "state_ended", "state_active", "Incarnations", "head_log_chars")
        ]
        rows.append(row)
    growth_lines = []
    flat = []
    for name, value in judged.items():
        first, last = growth(by_hour, value)
        key = name.split(".", 1)[-1]
        if grew(first, last, name):
            why = RETENTION.get(key, "NOT EXPLAINED: look for its retention (a bug if it has none)")
            growth_lines.append(
                f"- `{name}`: {fmt(first)} -> {fmt(last)} (first hour after warm-up -> last); {why}"
            )
        else:
            flat.append(f"`{name}` ({fmt(first)} -> {fmt(last)})")
    cpu_first, cpu_last = growth({h: [{"v": v[0]}] for h, v in cpu.items()}, lambda s: s["v"])
    t_hours = samples[-1]["t"] / 3600
    lines = [
        f"# Central soak: {t_hours:.2f} real hours, {len(by_hour)} simulated hours "
        f"({hour_seconds:.0f} s each), {runners} runner process(es)",
        "",
        f"Samples: `{path.name}` ({len(samples)}), plot: `{path.with_suffix('.png').name}`. "
        f"Command: `python -m bench.central_soak` (docstring: the load).",
        "",
    ]
    lines += md_table(header, rows)
    lines += [
        "",
        f"CPU per envelope (runner processes): {fmt(cpu_first, '{:.3f}')} ms in the first hour after "
        f"warm-up, {fmt(cpu_last, '{:.3f}')} ms in the last.",
        "",
        "## Grew after the first simulated hour",
        "",
    ]
    lines += growth_lines or ["- nothing"]
    errors = probe_errors(samples)
    if errors:
        lines += ["", "## The runners' probe failed (those samples lack the cache sizes)", "",
                  *(f"- {e}" for e in errors)]
    lines += ["", "## Flat (first hour after warm-up -> last)", "", ", ".join(flat), ""]
    text = "\n".join(lines)
    print(text)
    path.with_suffix(".md").write_text(text, encoding="utf-8")
    _plot(path, samples, runners)
    return 1 if any("NOT EXPLAINED" in line for line in growth_lines) else 0


def _plot(path: Path, samples: List[Sample], runners: int) -> None:
    x = [s["t"] / 60 for s in samples]

    def col(value: Value) -> List[Optional[float]]:
        return [value(s) for s in samples]

    cpu: List[Optional[float]] = [None] + [_per_envelope(a, b, "cpu_s") for a, b in zip(samples, samples[1:])]
    panels: List[Tuple[str, Dict[str, Any]]] = [
        ("RSS MiB", {f"runner{i}": col(_runner(i, "rss_mib")) for i in range(runners)}),
        ("CPU ms / envelope", {"runner processes": cpu}),
        (
            "cache entries",
            {k: col(_probe(k)) for k in ("seen_ids", "raised_keys", "cached_ended", "cached_active")},
        ),
        (
            "State rows",
            {k: col(_table(k)) for k in ("state_ended", "state_active", "state_alerts", "state_vms")},
        ),
        ("log tables", {k: col(_table(k)) for k in ("Incarnations", "Decisions", "Alerts", "Quarantine")}),
    ]
    plot(path.with_suffix(".png"), "central soak", x, "minutes", panels)
