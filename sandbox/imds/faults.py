"""Fault injection: the next N matching /metadata requests fail, stall, or get a bad body."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

KINDS = ("status", "slow", "malformed", "invalid", "reset")
PATHS = ("scheduledevents", "compute", "token", "attested", "any")
_STATUSES = (400, 403, 404, 405, 410, 429, 500, 502, 503, 504)


@dataclass
class Fault:
    kind: str
    vm: Optional[str] = None  # None: every VM
    path: str = "scheduledevents"
    method: Optional[str] = None  # None: any method
    status: int = 500
    count: int = 1  # matching requests still to affect
    seconds: float = 0.0
    incarnation: Optional[int] = None  # for "reset": the lower number (default 1, or 0)

    def matches(self, vm: str, route: str, method: str) -> bool:
        return ((self.vm is None or self.vm == vm) and (self.path in ("any", route))
                and (self.method is None or self.method == method))

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def from_request(body: Any, known_vms: Sequence[str]) -> Fault:
    """A Fault from a POST /admin/faults body; raises ValueError naming the bad field."""
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object")
    kind = body.get("kind")
    if kind not in KINDS:
        raise ValueError(f"'kind' must be one of {list(KINDS)}")
    vm = body.get("vm")
    if vm is not None and vm not in known_vms:
        raise ValueError(f"'vm' must be a simulated VM ({list(known_vms)}) or absent for all")
    path = body.get("path") or "scheduledevents"
    if path not in PATHS:
        raise ValueError(f"'path' must be one of {list(PATHS)}")
    method = body.get("method")
    if method is not None and method not in ("GET", "POST"):
        raise ValueError("'method' must be 'GET', 'POST' or absent for both")
    status = body.get("status", 500)
    if kind == "status" and status not in _STATUSES:
        raise ValueError(f"'status' must be one of {list(_STATUSES)}")
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError("'count' must be an integer >= 1")
    seconds = body.get("seconds", 0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 600:
        raise ValueError("'seconds' must be a number of real seconds in [0, 600]")
    if kind == "slow" and seconds <= 0:
        raise ValueError("a 'slow' fault needs 'seconds' > 0")
    incarnation = body.get("incarnation")
    if incarnation is not None and (isinstance(incarnation, bool) or not isinstance(incarnation, int)
                                    or incarnation < 0):
        raise ValueError("'incarnation' must be an integer >= 0")
    return Fault(kind=kind, vm=vm, path=path, method=method, status=int(status), count=count,
                 seconds=float(seconds), incarnation=incarnation)


class FaultBook:
    """Armed faults, consumed one matching request at a time (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: List[Fault] = []

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def armed(self) -> List[Dict[str, Any]]:
        with self._lock:
            return [f.to_json() for f in self._faults]

    def take(self, vm: str, route: str, method: str) -> List[Fault]:
        """The faults this request triggers: at most one slow plus the first body/status fault."""
        taken: List[Fault] = []
        with self._lock:
            for kind_group in (("slow",), ("status", "malformed", "invalid")):
                for fault in self._faults:
                    if fault.kind in kind_group and fault.matches(vm, route, method):
                        fault.count -= 1
                        taken.append(fault)
                        break
            self._faults = [f for f in self._faults if f.count > 0]
        return taken
