"""When an alert owed is tried again, leased or given up, and what it says when delivered (pure, but for
its State row op): the rules central.runtime.act applies to alerts (issue 24 moved them here from act.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import List, Optional, Set

from central.model.alert import ALERT_LEASE, Alert
from central.model.events import ARM_PREFIX, Approval, EventRecord
from central.model.times import iso, parse
from central.store import state_rows as rows
from central.store.tables import Op

SEVERITIES = ("info", "warning", "critical")  # STATUS_ALERT_MIN_SEVERITY's values, least first
_RANK = {name: i for i, name in enumerate(SEVERITIES)}
DEFAULT_FLOOR = "warning"  # an event's routine statuses (started as approved, ended) are not posted
ALERT_ROUNDS = 5  # delivery rounds of a non-critical alert (the first call + timer retries), then given up
RETRY_CAP = timedelta(hours=1)  # a critical alert is never given up: retried with backoff up to this


def status_severity(rec: EventRecord, status: str) -> str:
    """An event-status alert's severity. An end (Completed, Cancelled) and a start after central approved
    it are routine: info. Anything else (Scheduled, a start nobody approved: Azure's at NotBefore, or one
    an operator held; an event central ended as stale) says what its decision says (warning by default)."""
    routine_end = status in ("Completed", "Cancelled") and rec.decision.get("action") != "ended-stale"
    if routine_end or (status == "Started" and approved(rec)):
        return "info"
    return rec.decision.get("severity") or "warning"


def approved(rec: EventRecord) -> bool:
    """Its start was approved: a result said so (central's message, ARM's acknowledge, or a VM's own fast
    path reporting its approval), or central's message was out, live, when it started (sent, not taken
    back by an operator's hold, not expired: a forwarder refuses an expired message). An ARM attempt is
    marked sent only when its answer is settled, which a start that came first stops: it counts as out."""
    return rec.state == "approved" or any(a.result == "approved" or _out_when_started(a)
                                          for a in rec.approvals)


def _out_when_started(a: Approval) -> bool:
    return (a.result == "event-started" and (a.sent or a.vm_name.startswith(ARM_PREFIX)) and not a.revoked
            and (a.result_at is None or a.result_at <= a.expires_at))


def below(severity: str, floor: str) -> bool:
    """Under the floor (STATUS_ALERT_MIN_SEVERITY): not posted. An unknown severity counts as warning."""
    return _RANK.get(severity, 1) < _RANK.get(floor, 1)


def quiet_status(kind: str, severity: str, floor: str) -> bool:
    """A status alert under the floor: not posted (any other kind always is)."""
    return kind == "event-status" and below(severity, floor)


def drop_quiet(rec: EventRecord, floor: str) -> Set[str]:
    """Take out of `rec` its owed status alerts under `floor` (their facts are its Incarnations and
    Decisions rows; nothing is posted, written or retried for them): the keys taken out."""
    quiet = {raw["key"] for raw in rec.pending_alerts if quiet_status(
        raw.get("kind", ""), status_severity(rec, raw.get("status") or rec.status), floor)}
    if quiet:
        rec.pending_alerts = [raw for raw in rec.pending_alerts if raw["key"] not in quiet]
    return quiet


def given_up(alert: Alert, rounds_limit: int = ALERT_ROUNDS) -> bool:
    """A critical alert is retried until delivered, however long the webhook is down; others stop."""
    return alert.severity != "critical" and alert.rounds >= rounds_limit


def next_try(alert: Alert, now: datetime) -> datetime:
    """The next timer run for the first rounds, then exponential backoff (critical alerts only)."""
    if alert.rounds < ALERT_ROUNDS:
        return now
    return now + min(RETRY_CAP, timedelta(seconds=60 * 2 ** min(alert.rounds - ALERT_ROUNDS, 10)))


def row_op(alert: Alert, etag: Optional[str]) -> Op:
    """An alert owed by no event, written to its own State row (If-Match on `etag` when it has one)."""
    return Op("replace", rows.alert_row(alert), etag) if etag else Op("upsert", rows.alert_row(alert))


def is_due(raw: dict, now: datetime) -> bool:
    """An owed alert (as its event row holds it) whose next try has come."""
    nxt = parse(raw.get("nextTry"))
    return nxt is None or nxt <= now


def lease(rec: EventRecord, keys: List[str], now: datetime) -> bool:
    """Lease the due alerts of `keys` on `rec` for ALERT_LEASE (a timer run tries them; others wait)."""
    leased = False
    for raw in rec.pending_alerts:
        if raw["key"] in keys and is_due(raw, now):
            raw["nextTry"] = iso(now + ALERT_LEASE)
            leased = True
    return leased


def build(rec: EventRecord, alert: Alert) -> Alert:
    """An event's alert as delivered: the event's current facts and decision."""
    last = rec.approvals[-1] if rec.approvals else None
    own = dict(alert.facts or {})  # what the alert itself carries (an operator's decision) stays
    alert.facts = {
        "eventId": rec.event_id,
        "eventType": rec.event_type,
        "eventSource": rec.event_source,
        "status": rec.status,
        "resources": ", ".join(rec.resources[:20]),
        "notBefore": iso(rec.not_before) if rec.not_before else "",
        "durationInSeconds": rec.duration,
        "decision": rec.decision.get("action", ""),
        "state": rec.state,
        "reason": rec.decision.get("reason", ""),
        "leader": last.vm_name if last else "",
        "reportedBy": len(rec.reported_by),
        **own,
    }
    if alert.kind == "event-status":
        status = alert.status or rec.status
        alert.severity = status_severity(rec, status)
        more = f" (+{len(rec.resources) - 5})" if len(rec.resources) > 5 else ""
        alert.title = f"{rec.event_type} {status}: {', '.join(rec.resources[:5])}{more}"
        nb = f", NotBefore {iso(rec.not_before)}" if rec.not_before and status == "Scheduled" else ""
        alert.text = (
            f"Event {rec.event_id} ({rec.event_source}) is {status}{nb}. "
            f"Decision: {rec.decision.get('action', 'none')} - {rec.decision.get('reason', '')}"
        )
    return alert
