"""How far behind the hub this instance reads, so a backlog does not make live forwarders look silent.

A forwarder is live when central heard from it within LEADER_LIVENESS_SECONDS, "heard" meaning the hub
time of its last envelope central has read. An instance reading a backlog (after its own outage, a
Storage fault, a restart) reads envelopes minutes old: judged by the wall clock, every forwarder of that
backlog looks silent, and the failover routes their approvals through ARM, which runs no pre-approve hook
(found by the fault suite: a 60 s Storage fault left central ~80 s behind with a 60 s liveness). Judged
as of what the instance has read, they are live. So the liveness the decisions use is widened by the
intake lag: the age of the newest envelope of a batch when the batch is read.

The lag is this instance's largest of the last WINDOW seconds (a batch of a partition read in time must
not hide another partition's backlog), and none once no batch has come for WINDOW seconds: when every
forwarder goes silent, no batch comes, and silence is judged by the wall clock again. Widening errs on
the side of the VM's own forwarder (its hook runs); a dead forwarder is failed over later by at most the
lag. CAP bounds it.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Callable, Iterable

WINDOW = 120.0  # seconds a lag counts after the batch that showed it
CAP = timedelta(hours=24)


class IntakeLag:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lag = 0.0  # seconds
        self._at = float("-inf")  # the clock when it was seen
        self._lock = threading.Lock()

    def note(self, now: datetime, received: Iterable[datetime]) -> None:
        """A batch read at `now` whose envelopes the hub took at `received`."""
        newest = max(received, default=None)
        if newest is None:
            return
        lag = max(0.0, (now - newest).total_seconds())
        at = self.clock()
        with self._lock:
            if lag >= self._lag or at - self._at > WINDOW:
                self._lag, self._at = lag, at

    def allowance(self) -> timedelta:
        """What to add to the liveness interval now: the largest recent lag (zero when none is recent)."""
        with self._lock:
            if self.clock() - self._at > WINDOW:
                return timedelta(0)
            return min(timedelta(seconds=self._lag), CAP)
