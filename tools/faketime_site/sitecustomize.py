"""Loaded only by `python -m tools.any_date` (PYTHONPATH), in every Python process of a run under faketime.

With FAKETIME_DONT_FAKE_MONOTONIC=1 (only the calendar moves), libfaketime 0.9.10 still rewrites the
absolute deadline of clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which CPython 3.11's time.sleep uses,
by the fake offset: every sleep fails with EINVAL. A relative select() sleep is the same sleep and passes
through libfaketime untouched. Nothing else is changed."""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        select.select([], [], [], left)


time.sleep = _sleep
