"""Storage's clock, for an instance whose own clock has drifted (issue 50's fault: one runner 5 min ahead).

Every instance decides by the time: windows opening, a leader's liveness (now minus when the hub took its
last envelope), NotBefore, leases. An instance whose clock runs ahead approved an event minutes before its
window opened by the true clock, and judged every forwarder silent. Storage answers every request with a
`Date` header from the service's own clock, the one clock every instance shares: `ServerClock.observe` is the
Azure SDK clients' `raw_response_hook`, and `now()` is the local clock corrected by the median of the last
few offsets once that median is beyond TOLERANCE, until it is back within RELEASE (the header has whole
seconds; a correct clock is left alone). It says so in one warning line when a correction starts or ends.
CentralService.from_settings installs `now` as central's clock (central.model.times.use_clock), so every
time central reads without being given one is Storage's when the two disagree.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections import deque
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Callable, Deque, Optional, Sequence

from central.model.times import host_now

log = logging.getLogger(__name__)

TOLERANCE = 2.0  # seconds: a correction starts beyond this (Date has whole seconds)...
RELEASE = 1.0  # ...and ends only within this, so a median near the threshold does not flap
SAMPLES = 9  # the last responses' offsets the median is taken over
LEAST = 3  # offsets needed before a correction is made
HOLD = 2 * TOLERANCE  # seconds: now() never steps back by less than this (the median moves in 1 s steps)


def offset_of(date_header: Optional[str], local: datetime) -> Optional[float]:
    """Seconds Storage's clock is ahead of `local` by one response's Date header (None: no usable header).
    Date is truncated to the second: its middle (+0.5 s) is the best estimate."""
    if not date_header:
        return None
    try:
        server = parsedate_to_datetime(date_header)
    except (TypeError, ValueError):
        return None
    if server.tzinfo is None:
        server = server.replace(tzinfo=timezone.utc)
    return (server - local).total_seconds() + 0.5


def correction(offsets: Sequence[float], correcting: bool = False) -> float:
    """Seconds to add to the local clock: the offsets' median once it is beyond TOLERANCE, and while it
    stays beyond RELEASE when a correction is already on (`correcting`); else 0."""
    if len(offsets) < LEAST:
        return 0.0
    middle = statistics.median(offsets)
    return middle if abs(middle) > (RELEASE if correcting else TOLERANCE) else 0.0


class ServerClock:
    """The local clock, corrected to Storage's once they disagree by more than TOLERANCE."""

    def __init__(self, local: Callable[[], datetime] = host_now) -> None:
        self._local = local
        self._offsets: Deque[float] = deque(maxlen=SAMPLES)
        self._lock = threading.Lock()
        self._applied = 0.0
        self._last: Optional[datetime] = None

    def observe(self, pipeline_response: Any) -> None:
        """azure-core's raw_response_hook: note the offset of one response's Date header."""
        headers = getattr(getattr(pipeline_response, "http_response", None), "headers", None) or {}
        sample = offset_of(headers.get("Date"), self._local())
        if sample is None:
            return
        with self._lock:
            self._offsets.append(sample)
            now_applied = correction(list(self._offsets), self._applied != 0.0)
            changed = (now_applied == 0.0) != (self._applied == 0.0)
            self._applied = now_applied
        if changed and now_applied:
            log.warning("this instance's clock is %+.1f s off Storage's: deciding by Storage's clock",
                        -now_applied)
        elif changed:
            log.warning("this instance's clock agrees with Storage's again")

    @property
    def skew_seconds(self) -> float:
        """How far the local clock is ahead of Storage's (0 within TOLERANCE)."""
        return -self._applied

    def now(self) -> datetime:
        """The corrected time. It never steps back by less than HOLD (a new median a second lower holds
        it still instead); a larger step back is a correction starting, which must go through."""
        with self._lock:
            moment = self._local() + timedelta(seconds=self._applied)
            if self._last is not None and timedelta(0) < self._last - moment < timedelta(seconds=HOLD):
                return self._last
            self._last = moment
            return moment
