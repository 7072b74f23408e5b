"""IMDS's per-VM budget: at most `limit` requests in any sliding `window` seconds, else 429."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Deque, Dict


class SlidingWindowLimiter:
    """Counts every /metadata request a VM makes (token path included). A request answered 429
    by the limiter does not use budget (our choice: a client that backs off recovers at once)."""

    def __init__(self, limit: int = 5, window: float = 1.0) -> None:
        self.limit, self.window = limit, window
        self._lock = threading.Lock()
        self._seen: Dict[str, Deque[float]] = {}

    def admit(self, vm: str) -> bool:
        if self.limit <= 0:  # disabled
            return True
        now = time.monotonic()
        with self._lock:
            times = self._seen.setdefault(vm, deque())
            while times and now - times[0] >= self.window:
                times.popleft()
            if len(times) >= self.limit:
                return False
            times.append(now)
            return True

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()
