"""UTC timestamps in the RFC 3339 form the envelope uses."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional


def iso(ts: Optional[float] = None) -> str:
    """RFC 3339 UTC with milliseconds, e.g. 2026-11-21T04:40:58.123Z."""
    moment = datetime.now(timezone.utc) if ts is None else datetime.fromtimestamp(ts, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
