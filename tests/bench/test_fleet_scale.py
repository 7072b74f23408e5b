"""bench.fleet_scale's reference for item 4 (issue 24): the same fleet played on 2 runners and on 1 runner at
the same time, each with its own hub and tables, both to their last envelope (a table prefix central's
settings refused once left one of the two with nothing to process)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import fleet_scale
from sandbox import processes


def test_two_plays_side_by_side_each_process_their_whole_fleet(azurite: processes.Server,
                                                               tmp_path: Path) -> None:
    args = argparse.Namespace(minutes=1, wave=0.05, events_per_vm_month=4.0, fast_minutes=15.0,
                              fast_interval=2.0, timeout=90.0, idle_seconds=1.0, balance_seconds=10.0,
                              warmup_timeout=60.0)
    many, one = fleet_scale.side_by_side(100, args, azurite, tmp_path, 2)
    assert (many["instances"], one["instances"]) == (2, 1)
    assert many["envelopes"] == one["envelopes"] == 105  # a minute of heartbeats and a 5 % wave
    assert many["warmed_instances"] == 2 and one["warmed_instances"] == 1
    assert many["app_cpu_s_per_1000"] > 0 and one["app_cpu_s_per_1000"] > 0
    assert many["trips_per_1000"] > 0 and one["trips_per_1000"] > 0
