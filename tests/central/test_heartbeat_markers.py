"""The `se.heartbeat` and `se.outbox_dropped` log markers: what infra's Azure Monitor alerts and the
workbook read (infra/app/alerts.bicep), how many VMs a line names, and how often a VM is named."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Optional

import pytest

from .conftest import Env, Hook
from .factory import T0, Vm, body

ALERTS = Path(__file__).resolve().parents[2] / "infra" / "app" / "alerts.bicep"


def test_heartbeat_markers_of_a_batch_share_lines_the_alert_query_expands(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """One `se.heartbeat` line names up to 100 VMs (one billed record, docs/sizing.md); the alert's
    extract_all finds every VM of the batch in it, and none twice."""
    bicep = ALERTS.read_text()
    pattern = re.search(r"extract_all\(@'(vmId=[^']+)'", bicep).group(1)
    svc = env.service()
    vms = [Vm(f"vm-{i}") for i in range(130)]
    with caplog.at_level(logging.INFO, logger="central.ingest"):
        svc.handle_batch([body(vm.heartbeat(at=T0)) for vm in vms[:65]], now=T0)
        svc.handle_batch([body(vm.heartbeat(at=T0)) for vm in vms[65:]], now=T0)
    beats = [r.getMessage() for r in caplog.records if r.getMessage().startswith("se.heartbeat ")]
    named = [vm_id for line in beats for vm_id in re.findall(pattern, line)]
    assert sorted(named) == sorted(vm.vm_id for vm in vms)
    assert len(beats) < len(vms) // 10, len(beats)  # per batch segment, not per VM


@pytest.mark.parametrize("minutes", [None, "5"])
def test_a_vm_beating_every_minute_is_never_silent_for_the_alert_yet_named_sparingly(
    env: Env, caplog: pytest.LogCaptureFixture, minutes: Optional[str]
) -> None:
    """The heartbeats-missing alert fires after HEARTBEAT_MISSING_MINUTES (infra's heartbeatMissingMinutes,
    15 by default, 5 at least) with no `se.heartbeat` naming the VM: over an hour of heartbeats every
    60 s, no gap between markers reaches the window, and there are no more than two a window."""
    window = 60 * float(minutes or 15)
    svc = env.service(**({"HEARTBEAT_MISSING_MINUTES": minutes} if minutes else {}))
    a = Vm("vm-a")
    seen = []
    with caplog.at_level(logging.INFO, logger="central.ingest"):
        for second in range(0, 3601, 60):
            at = T0 + timedelta(seconds=second)
            before = len(caplog.records)
            svc.handle_batch([body(a.heartbeat(at=at))], now=at)
            if any(r.getMessage().startswith("se.heartbeat ") for r in caplog.records[before:]):
                seen.append(second)
    gaps = [b - a for a, b in zip(seen, seen[1:])] + [3600 - seen[-1]]
    assert seen[0] == 0 and max(gaps) < window, seen
    assert len(seen) <= 3600 / (window / 2) + 1, seen


def test_heartbeat_missing_minutes_outside_infra_bounds_is_refused() -> None:
    from central.runtime.settings import CentralSettings, SettingsError

    for bad in ("4", "1441", "x"):
        with pytest.raises(SettingsError, match="HEARTBEAT_MISSING_MINUTES"):
            CentralSettings.from_mapping({"HEARTBEAT_MISSING_MINUTES": bad})


def test_monitoring_log_markers_match_the_infra_alert_queries(
    env: Env, hook: Hook, caplog: pytest.LogCaptureFixture
) -> None:
    """infra/app/alerts.bicep's log alerts extract vmId= and dropped= from these lines: keep them in step."""
    bicep = ALERTS.read_text()
    vm_pattern = re.search(r"extract\(@'(vmId=[^']+)'", bicep).group(1)
    dropped_pattern = re.search(r"extract\(@'(dropped=[^']+)'", bicep).group(1)
    svc = env.service()
    a = Vm("vm-a")
    with caplog.at_level(logging.INFO, logger="central.ingest"):
        svc.handle_batch([body(a.heartbeat(at=T0, dropped=0))], now=T0)
        svc.handle_batch([body(a.heartbeat(at=T0 + timedelta(seconds=60), dropped=3))],
                         now=T0 + timedelta(seconds=60))
        svc.handle_batch([body(a.heartbeat(at=T0 + timedelta(seconds=460), dropped=3))],
                         now=T0 + timedelta(seconds=460))
    lines = [r.getMessage() for r in caplog.records]
    beats = [line for line in lines if line.startswith("se.heartbeat ")]
    assert len(beats) == 2, beats  # throttled: T0 and T0+460 s (450 s apart at most), not T0+60 s
    assert all(re.search(vm_pattern, line).group(1) == a.vm_id for line in beats)
    (drop,) = [line for line in lines if line.startswith("se.outbox_dropped ")]
    assert re.search(vm_pattern, drop).group(1) == a.vm_id
    assert re.search(dropped_pattern, drop).group(1) == "3"
