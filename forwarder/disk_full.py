"""A full disk under the state directory, said once (issue 50's fault: the forwarder's disk full).

Every worker writes the outbox (the poller an incarnation, the heartbeat a beat, the publisher its last
error), so a full disk failed all of them at every try, each with a traceback: a flood that hid the one fact
that mattered. Now the first failure says it in one line; the others are quiet until a write succeeds again
(`Outbox.put`), which says so once too. Nothing already in the outbox is touched: SQLite refuses the new
write as a whole (its transaction rolls back) and the publisher keeps draining what is there.
"""

from __future__ import annotations

import errno
import sqlite3
import threading
from typing import Optional

FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def is_disk_full(exc: Optional[BaseException]) -> bool:
    """`exc` (or an exception it was raised from or during) is SQLite's SQLITE_FULL or an OSError ENOSPC."""
    for _ in range(8):  # bounded walk down the chain
        if exc is None:
            return False
        if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
            return True
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Notice:
    """Whether the full disk has been said (process-wide: one line however many workers fail)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._full = False

    def full(self) -> bool:
        """Note a failure; True the first time (say it), False while it is already said."""
        with self._lock:
            first, self._full = not self._full, True
            return first

    def cleared(self) -> bool:
        """Note a successful write; True if the disk had been said full (say it has space again)."""
        with self._lock:
            was, self._full = self._full, False
            return was


NOTICE = Notice()
