"""bench.side_by_side: the two plays run at the same time, in two processes (a ratio of their CPU sees the
machine's drift once, not twice)."""

from __future__ import annotations

import os
import time
from typing import Tuple

from bench import side_by_side


def span(seconds: float) -> Tuple[float, float, int]:
    """(start, end, pid) of a busy play of `seconds` (monotonic time: one clock for every process)."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        pass
    return start, time.monotonic(), os.getpid()


def test_the_two_plays_overlap_in_two_processes() -> None:
    (a0, a1, here), (b0, b1, there) = side_by_side.run(lambda: span(1.0), span, 1.0)
    assert here == os.getpid() and there != here
    assert b0 < a1 and a0 < b1  # played one after the other, one would end before the other began
    assert abs(a0 - b0) < 0.5  # the other process's imports were done before either began
