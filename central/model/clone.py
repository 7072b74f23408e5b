"""A fast deep copy of an event record (central plans and acts on copies, then commits them).

copy.deepcopy spends most of its time on bookkeeping (the memo, __reduce_ex__, dispatch per object) that
these records do not need: their fields are JSON-like trees (dict, list, str, numbers, bool, None), times
(immutable) and Approval dataclasses, with no shared or cyclic references. Anything else falls back to
copy.deepcopy, so the result is always a deep copy; tests/central/test_clone.py checks it against deepcopy.
Measured on the platform_feed bench (cProfile): a third of central's CPU per status transition was deepcopy.
"""

from __future__ import annotations

import copy
from datetime import date, datetime, time, timedelta
from typing import Any, TypeVar

from .events import EventRecord

T = TypeVar("T")
_IMMUTABLE = frozenset({str, int, float, bool, type(None), datetime, date, time, timedelta, bytes})


def tree(value: Any) -> Any:
    """A deep copy of a JSON-like value; dataclass objects (with a __dict__) are copied field by field."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is dict:
        return {k: tree(v) for k, v in value.items()}
    if kind is list:
        return [tree(v) for v in value]
    if kind is tuple:
        return tuple(tree(v) for v in value)
    if hasattr(kind, "__dataclass_fields__") and hasattr(value, "__dict__"):
        new = object.__new__(kind)
        new.__dict__.update({k: tree(v) for k, v in value.__dict__.items()})
        return new
    return copy.deepcopy(value)


def clone_event(rec: EventRecord) -> EventRecord:
    """The same as copy.deepcopy(rec), faster."""
    out: EventRecord = tree(rec)
    return out
