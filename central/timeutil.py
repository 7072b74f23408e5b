"""Time parsing and formatting: IMDS NotBefore (RFC 1123 or ISO 8601) and ISO 8601 UTC output."""

from __future__ import annotations

from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Optional


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


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


def parse(text: Optional[str]) -> Optional[datetime]:
    """An IMDS or envelope time: RFC 1123 ("Mon, 11 Apr 2022 22:26:58 GMT") or ISO 8601; None if
    empty or unreadable (NotBefore is "" once an event has Started)."""
    if not text:
        return None
    try:
        if text[:1].isdigit():
            return aware(datetime.fromisoformat(text.replace("Z", "+00:00")))
        return aware(parsedate_to_datetime(text))
    except (ValueError, TypeError, IndexError):
        return None
