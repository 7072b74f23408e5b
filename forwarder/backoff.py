"""Exponential backoff with full jitter (delay drawn uniformly from [0, min(cap, base * 2^n)]).

Full jitter spreads a fleet's retries so thousands of VMs recovering at once do not hit a
service in lockstep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Backoff:
    base: float = 0.25
    cap: float = 8.0
    attempt: int = 0
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def ceiling(self) -> float:
        """The upper bound of the next delay (before jitter)."""
        return min(self.cap, self.base * (2 ** min(self.attempt, 30)))

    def next_delay(self) -> float:
        """The delay before the next retry; each call widens the window up to `cap`."""
        delay = self.rng.uniform(0.0, self.ceiling())
        self.attempt += 1
        return delay

    def delay_after(self, retry_after: Optional[float], longest: Optional[float] = None) -> float:
        """The next delay, never sooner than the service's Retry-After (429/503), which is believed up to
        `longest` seconds (default: `cap`), so a broken or hostile header cannot park a worker for hours."""
        delay = self.next_delay()
        if retry_after:
            delay = max(delay, min(float(retry_after), self.cap if longest is None else longest))
        return delay

    def reset(self) -> None:
        self.attempt = 0
