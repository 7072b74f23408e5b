"""Exponential backoff with full jitter (delay drawn uniformly from [0, min(cap, base * 2^n)]).

Full jitter spreads a fleet's retries so thousands of VMs recovering at once do not hit a
service in lockstep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


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

    def reset(self) -> None:
        self.attempt = 0
