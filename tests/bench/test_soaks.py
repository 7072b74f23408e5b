"""The soaks' code paths (issue 50), run for seconds so they cannot rot: real processes, the samples files and
the reports. The soaks' figures come from `make soak` (hours), never from a test.

The forwarder soak runs the forwarder on this venv's Python (`--python`; the soak itself uses the pinned VM
venv) and its TLS relay on a free loopback port (the soak's own is 127.0.0.50:443, which needs root), so a
soak running at the same time is not disturbed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench import central_soak, forwarder_soak
from bench.soak_report import load
from sandbox import processes


def test_the_forwarder_soak_plays_its_events_outage_and_rotation_and_samples_them(tmp_path: Path) -> None:
    out, work = tmp_path / "forwarder-soak.jsonl", tmp_path / "work"
    # 6 simulated hours at 1200x (18 s): an event each hour (approved, hook-run, held, expired, approved,
    # hook-run), Event Hubs down from hour 1.5 to 2.5, the log rotated at hour 2.4. The publisher's back-off
    # is real time (jittered, doubling from 0.5 s): after the 3 real seconds down, its next try may be 4 s
    # away, so the outage leaves 10 real seconds to drain in (at hour 2.5 it left 7.5, and a loaded
    # machine ended a run with the backlog still there: 104 rows against 43 at the outage's end)
    code = forwarder_soak.main(["--days", "0.25", "--speed", "1200", "--event-hours", "1",
                                "--notice-minutes", "60", "--outage-hour", "1.5",
                                "--warmup-outage-minutes", "60", "--rotate-day", "0.1",
                                "--python", sys.executable, "--hub-host", processes.LOOPBACK,
                                "--hub-port", str(processes.free_port()), "--out", str(out),
                                "--work", str(work)])
    records = load(out)
    samples = [r for r in records if r["kind"] == "sample"]
    (day,) = [r for r in records if r["kind"] == "day"]
    assert code == 1  # under 3 simulated days the rules cannot be judged: the report says so, not PASS
    assert "FAIL** enough simulated days" in out.with_suffix(".md").read_text()
    assert len(samples) >= 5
    assert all(s["rss_mib"] > 5 and s["fds"] > 3 and s["threads"] > 1 for s in samples[1:])  # [0]: at spawn
    assert day["polls"] > 20 and day["tokens"] >= 1
    assert day["posts"] >= 2 and day["hook_runs_total"] >= 1  # approved and hook-run events were POSTed
    down = [s["outbox_rows"] for s in samples if s["outage"]]  # the sample at hour 2
    (outage,) = [r for r in records if r["kind"] == "outage"]
    assert down and max(down) > 0 and outage["rows_at_end"] > 0  # heartbeats kept while Event Hubs was down
    assert samples[-1]["outbox_rows"] < outage["rows_at_end"]  # and sent after it came back
    assert samples[-1]["rotations"] == 1 and (work / "forwarder.log.1").exists()
    assert samples[-1]["log_written"] > (work / "forwarder.log.1").stat().st_size  # it kept logging
    assert out.with_suffix(".png").stat().st_size > 1000


def test_the_central_soak_samples_runner_caches_and_tables(tmp_path: Path) -> None:
    out = tmp_path / "central-soak.jsonl"
    # 60 VMs beating every 5 s on one runner for ~22 s, a wave of 6 VMs every 8 s (Scheduled, Started, gone)
    code = central_soak.main(["--hours", "0.006", "--vms", "60", "--instances", "1",
                              "--heartbeat-seconds", "5", "--hour-seconds", "8", "--first-wave", "2",
                              "--wave", "0.1", "--sample-seconds", "4",
                              "--out", str(out), "--work", str(tmp_path / "work")])
    samples = load(out)
    last = samples[-1]
    runner = last["runners"][0]
    assert len(samples) >= 3
    assert runner["ingested"] > 60 and runner["rss_mib"] > 20 and runner["cpu_s"] > 0
    assert runner["probe"]["seen_ids"] > 0 and runner["probe"]["cached_vms"] == 60
    assert last["tables"]["state_vms"] == 60
    assert last["tables"]["Incarnations"] >= 6 and last["tables"]["Decisions"] >= 6
    assert last["tables"]["state_ended"] >= 6  # the waves' events went Scheduled, Started and gone
    assert code == 0  # every growth the report saw has its retention named
    assert "## Grew after the first simulated hour" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 1000


def test_a_probe_error_is_reported_not_summed(tmp_path: Path) -> None:
    """A runner's probe that failed records {"error": ...}: the report names it, judges the other runner's
    caches, and does not read the missing sizes as 0."""
    import json

    from bench.central_soak_report import report

    def sample(t: float, probe: dict) -> dict:
        return {"t": t, "hour": t / 600, "tables": {"state_vms": 2},
                "runners": [{"rss_mib": 90.0, "threads": 10, "fds": 10, "ingested": int(t), "cpu_s": t / 100,
                             "invocation_cpu_s": t / 200, "probe": probe}]}
    path = tmp_path / "central-soak.jsonl"
    rows = [sample(60.0 * i, {"t": 1, "seen_ids": 10 * i}) for i in range(1, 25)]
    rows[-1]["runners"][0]["probe"] = {"t": 1, "error": "RuntimeError('probe broke')"}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert report(path) == 0
    text = path.with_suffix(".md").read_text()
    assert "RuntimeError('probe broke')" in text
    assert "`runner0.seen_ids`: " in text  # judged on the samples that have it
