"""central.store.server_clock: an instance whose clock has drifted decides by Storage's clock (issue 50).

The pure parts on their own, then the clock fed real Azurite responses through the real SDK clients with
the instance's clock moved 5 minutes ahead (the fault suite's test_clock_ahead does it to a runner)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from central.model import times
from central.runtime.settings import storage_clients
from central.store.server_clock import LEAST, RELEASE, TOLERANCE, ServerClock, correction, offset_of
from sandbox import processes

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def response(date: Optional[str]) -> Any:
    return SimpleNamespace(http_response=SimpleNamespace(headers={"Date": date} if date else {}))


def test_offset_is_read_from_the_date_header_at_the_middle_of_its_second() -> None:
    assert offset_of("Sun, 01 Mar 2026 12:05:00 GMT", T0) == 300.5
    assert offset_of("Sun, 01 Mar 2026 11:55:00 GMT", T0) == -299.5
    assert offset_of(None, T0) is None
    assert offset_of("not a date", T0) is None


def test_a_correction_needs_a_few_offsets_beyond_the_tolerance() -> None:
    assert correction([-300.0] * (LEAST - 1)) == 0.0
    assert correction([-300.0, -299.6, -300.4]) == -300.0
    assert correction([TOLERANCE - 0.1] * 5) == 0.0  # the header's whole seconds: no correction
    assert correction([0.3, -300.0, 0.2, 0.4, -300.0]) == 0.0  # odd responses in a minority move nothing


def test_a_correction_ends_only_well_within_the_tolerance() -> None:
    assert correction([-1.5] * 5) == 0.0  # not started: within TOLERANCE
    assert correction([-1.5] * 5, correcting=True) == -1.5  # started: kept until within RELEASE
    assert correction([-(RELEASE - 0.1)] * 5, correcting=True) == 0.0


def test_a_clock_near_the_threshold_neither_flaps_nor_goes_back(caplog: pytest.LogCaptureFixture) -> None:
    """A host 2.2 s ahead: whole-second Date headers put each offset 0.5 s either side, so the median
    crosses TOLERANCE back and forth; one warning, and now() never decreases."""
    import random

    rng = random.Random(5)  # noqa: S311 - reproducible jitter
    local = [T0]
    clock = ServerClock(lambda: local[0])
    seen = []
    with caplog.at_level("WARNING", logger="central.store.server_clock"):
        for _ in range(2000):
            local[0] += timedelta(seconds=rng.uniform(0.01, 0.9))
            server = local[0] - timedelta(seconds=2.2)
            stamp = server.replace(microsecond=0).strftime("%a, %d %b %Y %H:%M:%S GMT")
            clock.observe(response(stamp))
            seen.append(clock.now())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "off Storage's" in lines[0], lines
    assert all(b >= a for a, b in zip(seen, seen[1:])), "now() went back"
    assert abs((seen[-1] - (local[0] - timedelta(seconds=2.2))).total_seconds()) < 1.5


def test_the_installed_clock_is_centrals_now() -> None:
    clock = ServerClock(lambda: T0)
    times.use_clock(clock.now)
    try:
        assert times.utcnow() == T0 and times.aware(None) == T0
    finally:
        times.use_clock(None)
    assert abs((times.utcnow() - datetime.now(timezone.utc)).total_seconds()) < 5


def test_the_clock_follows_storage_once_they_disagree_and_lets_go_when_they_agree_again() -> None:
    local = [T0 + timedelta(minutes=5)]  # this instance is 5 minutes ahead
    clock = ServerClock(lambda: local[0])
    clock.observe(response("Sun, 01 Mar 2026 12:00:00 GMT"))
    assert clock.now() == local[0], "one response is not enough"
    for _ in range(LEAST):
        clock.observe(response("Sun, 01 Mar 2026 12:00:00 GMT"))
    assert abs((clock.now() - T0).total_seconds() - 0.5) < 1e-6
    assert clock.skew_seconds == pytest.approx(299.5)
    local[0] = T0  # the clock is fixed (NTP caught up)
    for _ in range(9):
        clock.observe(response("Sun, 01 Mar 2026 12:00:00 GMT"))
    assert clock.skew_seconds == 0.0
    assert T0 <= clock.now() <= T0 + timedelta(seconds=0.5)  # held at the last corrected time, never back


def test_real_azurite_responses_through_the_sdk_clients_correct_a_clock_five_minutes_ahead(
        azurite: processes.Server) -> None:
    clock = ServerClock(lambda: datetime.now(timezone.utc) + timedelta(minutes=5))
    tables, queues = storage_clients({"S": azurite.extra["connection_string"]}, prefix="S", clock=clock)
    list(tables.list_tables())
    list(queues.list_queues())
    list(tables.list_tables())
    off = (clock.now() - datetime.now(timezone.utc)).total_seconds()
    assert abs(off) < 2.0, f"corrected clock still {off:+.1f} s off"
    assert 298 < clock.skew_seconds < 302
