"""central.store.server_clock: an instance whose clock has drifted decides by Storage's clock (issue 50).

The pure parts on their own, then the clock fed real Azurite responses through the real SDK clients with
the instance's clock moved 5 minutes ahead (the fault suite's test_clock_ahead does it to a runner)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from central.runtime.settings import storage_clients
from central.store.server_clock import LEAST, TOLERANCE, ServerClock, correction, offset_of
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
    assert clock.now() == T0 and clock.skew_seconds == 0.0


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
