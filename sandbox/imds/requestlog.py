"""The log of /metadata requests received, for tests (e.g. to see approvals) and operators."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Deque, Dict, List, Optional

_MAX_ENTRIES = 20_000  # bounded: a runaway client cannot exhaust memory
_MAX_BODY = 64 * 1024


@dataclass
class Entry:
    t: float  # unix time, seconds
    vm: str
    method: str
    path: str  # without the /vms/<name> prefix
    query: Dict[str, str]
    headers: Dict[str, str]
    body: str
    status: int = 0


class RequestLog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: Deque[Entry] = deque(maxlen=_MAX_ENTRIES)

    def add(self, entry: Entry) -> Entry:
        entry.body = entry.body[:_MAX_BODY]
        with self._lock:
            self._entries.append(entry)
        return entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def query(self, vm: Optional[str] = None, method: Optional[str] = None,
              path: Optional[str] = None) -> List[Dict[str, Any]]:
        """Entries in arrival order; `path` matches as a substring ("scheduledevents")."""
        with self._lock:
            entries = list(self._entries)
        return [asdict(e) for e in entries
                if (not vm or e.vm == vm) and (not method or e.method == method.upper())
                and (not path or path in e.path)]
