"""Time parsing and formatting: IMDS NotBefore (RFC 1123 or ISO 8601) and ISO 8601 UTC output.

Every parsed time is checked against what Azure Tables can hold (Edm.DateTime: 1601-01-01 to
9999-12-31, after conversion to UTC): a valid RFC 3339 text outside it (year 0001 with an offset,
9999-12-31T23:00-05:00) reads as unreadable (None) instead of overflowing later.
"""

from __future__ import annotations

from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Callable, Optional

TABLES_MIN = datetime(1601, 1, 2, tzinfo=timezone.utc)  # a day of margin at both ends
TABLES_MAX = datetime(9999, 12, 30, tzinfo=timezone.utc)


def host_now() -> datetime:
    """This host's own clock."""
    return datetime.now(timezone.utc)


_clock: Callable[[], datetime] = host_now


def use_clock(clock: Optional[Callable[[], datetime]]) -> None:
    """Where central's "now" comes from in this process: CentralService.from_settings installs Storage's
    clock (central.store.server_clock), which is this host's until the two disagree; None: the host's."""
    global _clock
    _clock = clock or host_now


def utcnow() -> datetime:
    """Central's now: every decision, lease and record time that no caller gave explicitly."""
    return _clock()


def aware(moment: Optional[datetime]) -> datetime:
    """`moment` in UTC (naive values are taken as UTC); now when None."""
    if moment is None:
        return utcnow()
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def iso(moment: datetime) -> str:
    """ISO 8601 UTC with milliseconds and a Z, sortable as text."""
    return aware(moment).strftime("%Y-%m-%dT%H:%M:%S.") + f"{aware(moment).microsecond // 1000:03d}Z"


def storable(moment: datetime) -> bool:
    """Inside the range an Edm.DateTime column holds (and Python can shift by a day)."""
    return TABLES_MIN <= moment <= TABLES_MAX


def parse(text: Optional[str]) -> Optional[datetime]:
    """An IMDS or envelope time: RFC 1123 ("Mon, 11 Apr 2022 22:26:58 GMT") or ISO 8601; None if
    empty, unreadable or outside what Table storage holds (NotBefore is "" once an event Started)."""
    if not text or not isinstance(text, str):
        return None
    try:
        if text[:1].isdigit():
            moment = aware(datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00")))
        else:
            moment = aware(parsedate_to_datetime(text))
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    return moment if storable(moment) else None
