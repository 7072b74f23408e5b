"""One request budget per VM, shared by everything that calls IMDS (including token calls).

IMDS allows 5 requests per second per VM and answers 429 above that; managed-identity token
requests count against the same budget. A sliding-window log (not a leaky average) guarantees the
limit holds in EVERY one-second window, which is how the server counts.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Deque, Optional


class RateLimitTimeout(Exception):
    """No request slot became free in time; the caller should retry later."""


class RateLimiter:
    """At most `limit` acquisitions in any `window` seconds. Thread-safe; never busy-waits."""

    def __init__(self, limit: int = 5, window: float = 1.05,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or window <= 0:
            raise ValueError("RateLimiter needs limit >= 1 and window > 0")
        self.limit = limit
        self.window = window  # a little over 1 s: client and server clocks see arrivals differently
        self._clock = clock
        self._stamps: Deque[float] = deque()
        self._lock = threading.Lock()

    def _wait_needed(self, now: float) -> float:
        while self._stamps and now - self._stamps[0] >= self.window:
            self._stamps.popleft()
        if len(self._stamps) < self.limit:
            return 0.0
        return self.window - (now - self._stamps[0])

    def acquire(self, timeout: float = 30.0, stop: Optional[threading.Event] = None) -> None:
        """Block until a slot is free (or raise RateLimitTimeout after `timeout` seconds)."""
        deadline = self._clock() + timeout
        while True:
            with self._lock:
                now = self._clock()
                wait = self._wait_needed(now)
                if wait <= 0:
                    self._stamps.append(now)
                    return
            if now + wait > deadline:
                raise RateLimitTimeout(f"no IMDS request slot free within {timeout:.1f}s "
                                       f"(limit {self.limit} per {self.window:.2f}s)")
            if stop is not None:
                if stop.wait(wait):
                    raise RateLimitTimeout("stopping")
            else:
                time.sleep(wait)
