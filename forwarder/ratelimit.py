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
        # answered() moves a stamp later, so the oldest is not always first: a handful of floats, scanned
        self._stamps = deque(t for t in self._stamps if now - t < self.window)
        if len(self._stamps) < self.limit:
            return 0.0
        return self.window - (now - min(self._stamps))

    def acquire(self, timeout: float = 30.0, stop: Optional[threading.Event] = None) -> float:
        """Block until a slot is free (or raise RateLimitTimeout after `timeout` seconds); returns the slot's
        stamp, for answered()."""
        deadline = self._clock() + timeout
        while True:
            with self._lock:
                now = self._clock()
                wait = self._wait_needed(now)
                if wait <= 0:
                    self._stamps.append(now)
                    return now
            if now + wait > deadline:
                raise RateLimitTimeout(f"no IMDS request slot free within {timeout:.1f}s "
                                       f"(limit {self.limit} per {self.window:.2f}s)")
            if stop is not None:
                if stop.wait(wait):
                    raise RateLimitTimeout("stopping")
            else:
                time.sleep(wait)

    def answered(self, stamp: float) -> None:
        """The request of the slot stamped `stamp` was answered (or failed): count it from now. IMDS counts a
        request when it arrives, some time between the send and the answer; a slot counted from its send
        lets a slow first request and a prompt sixth land inside IMDS's one second (a 429). Counted from the
        answer, no arrival is later than its stamp, so the window holds."""
        with self._lock:
            try:
                self._stamps.remove(stamp)
            except ValueError:
                return  # already out of the window
            self._stamps.append(self._clock())
