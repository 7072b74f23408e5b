"""An alert as central keeps it until delivered (the State table) and as the webhook sends it: a plain
record, built by intake and deciding, delivered by runtime.act through runtime.webhook."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Dict, Optional

from .times import iso, parse, utcnow

ALERT_LEASE = timedelta(seconds=60)  # the committing instance delivers first; others wait this long

@dataclass
class Alert:
    key: str  # dedupe key: one alert per key, ever (e.g. "<eventId>:Scheduled")
    kind: str  # event-status | quarantined | outbox-dropped | approval-failed | no-leader | policy-invalid
    severity: str  # info | warning | critical
    title: str
    text: str
    at: datetime
    event_id: Optional[str] = None
    status: Optional[str] = None
    facts: Dict[str, Any] = field(default_factory=dict)
    rounds: int = 0  # delivery rounds so far (the first call, then timer retries)
    next_try: Optional[datetime] = None  # no instance tries before this (a lease, then the backoff)
    error: str = ""  # the last round's error

    def to_json(self) -> Dict[str, Any]:
        """How a pending alert is kept in the State table (an event's row, or its own row)."""
        return {"key": self.key, "kind": self.kind, "severity": self.severity, "title": self.title[:1000],
                "text": self.text[:4000], "at": iso(self.at), "eventId": self.event_id, "status": self.status,
                "facts": self.facts, "rounds": self.rounds,
                "nextTry": iso(self.next_try) if self.next_try else None, "error": self.error[:500]}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Alert:
        return cls(d["key"], d["kind"], d.get("severity", "warning"), d.get("title", ""), d.get("text", ""),
                   parse(d.get("at")) or utcnow(), d.get("eventId"), d.get("status"), d.get("facts") or {},
                   int(d.get("rounds", 0)), parse(d.get("nextTry")), d.get("error", ""))


@dataclass
class Delivery:
    sent: bool
    attempts: int
    error: str = ""
    http_status: Optional[int] = None
    logged: bool = False  # no webhook is configured: the log line and the Alerts row are its only channel
    quiet: bool = False  # a status alert under STATUS_ALERT_MIN_SEVERITY: settled, not posted, no Alerts row

    @property
    def outcome(self) -> str:
        """sent | logged | below-floor | failed (the se.alerts metric's, the Alerts row's)."""
        return "sent" if self.sent else "logged" if self.logged else "below-floor" if self.quiet else "failed"
