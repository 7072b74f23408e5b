"""An exclusive lock on an open file that holds across processes: `flock` on POSIX, `msvcrt.locking` on
Windows (which has no fcntl). The daemon and `se-forwarder approve` both take it before touching the
approval ledger, so neither writes while the other reads or writes.
"""

from __future__ import annotations

import os
import time
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

try:
    import msvcrt
except ImportError:  # POSIX
    msvcrt = None  # type: ignore[assignment]

# Windows: the lock is on byte 0 of the lock file (locking a byte past the end of a file is allowed).
_LOCKED_BYTES = 1
_RETRY_SECONDS = 0.02


class LockTimeout(OSError):
    """Another process held the lock longer than the timeout."""


def acquire(handle: IO[Any], timeout: float) -> None:
    """Block until this process holds the lock on `handle` (at most `timeout` seconds on Windows, where a
    lock cannot wait by itself without msvcrt's fixed 10 x 1 s retries)."""
    if fcntl is not None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        return
    if msvcrt is None:  # neither (no supported platform lacks both): never pretend to lock
        raise OSError(f"no file locking on this platform ({os.name})")
    deadline = time.monotonic() + timeout
    while True:
        handle.seek(0)  # msvcrt locks from the current position
        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, _LOCKED_BYTES)
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise LockTimeout(f"{getattr(handle, 'name', 'lock file')} stayed locked for "
                                  f"{timeout:.0f}s") from None
            time.sleep(_RETRY_SECONDS)


def release(handle: IO[Any]) -> None:
    if fcntl is not None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return
    if msvcrt is not None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, _LOCKED_BYTES)
