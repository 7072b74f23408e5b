"""Simulated time: every simulated duration passes `scale` times faster in real time.

NotBefore is always the real wall-clock instant (RFC 1123, rounded up to the whole second) so a
client compares it with its own clock exactly as on Azure.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from email.utils import formatdate


@dataclass(frozen=True)
class Clock:
    scale: float = 1.0

    def now(self) -> float:
        return time.time()

    def real_seconds(self, simulated: float) -> float:
        """How long `simulated` seconds last in real time."""
        return simulated / self.scale

    def not_before(self, notice_simulated: float, now: float) -> float:
        """The real instant (whole second, rounded up) `notice_simulated` seconds from `now`."""
        return float(math.ceil(now + self.real_seconds(notice_simulated)))


def rfc1123(instant: float) -> str:
    """'Mon, 11 Apr 2022 22:26:58 GMT'."""
    return formatdate(instant, usegmt=True)


def iso(instant: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(instant)) + f".{int(instant % 1 * 1000):03d}Z"
