"""What central tells Azure Monitor: OpenTelemetry metrics (counts, latencies) and one `se.*` log line per
fact that names the event or VM (logs may carry ids; metric series may not).

Metrics have bounded cardinality: no VM, event or message id is ever an attribute (a per-VM series per
metric is what made node-termination-handler's metrics unusable on big fleets, NTH #925); every attribute
value comes from a small set, and any value past a per-attribute limit is counted as "other".

Without `configure(...)` (no APPLICATIONINSIGHTS_CONNECTION_STRING) every call is a cheap no-op on
OpenTelemetry's default meter. The names below are a contract with infra/app/workbook.bicep (a test
holds the workbook's queries to them); docs/central.md lists them.

Nothing here imports another central module: central calls these functions, never the reverse.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Tuple

from opentelemetry import metrics as otel

log = logging.getLogger("central.metrics")

METER_NAME = "scheduled_events.central"

# Metric names (instrument names; Application Insights shows them as customMetrics.name).
ENVELOPES = "se.envelopes"  # counter {type}
QUARANTINES = "se.quarantines"  # counter {origin}
DECISIONS = "se.decisions"  # counter {action, rule}
APPROVALS = "se.approvals"  # counter {outcome: sent | confirmed | failed | failed_over}
ALERTS = "se.alerts"  # counter {kind, outcome: sent | logged | below-floor | failed}
STORE_ERRORS = "se.store.errors"  # counter {operation}
DECISION_LATENCY = "se.decision.latency"  # histogram, s: event first seen -> approval sent {event_type}
APPROVAL_LATENCY = "se.approval.latency"  # histogram, s: approval sent -> result {event_type, outcome}
METRIC_NAMES = (ENVELOPES, QUARANTINES, DECISIONS, APPROVALS, ALERTS, STORE_ERRORS, DECISION_LATENCY,
                APPROVAL_LATENCY)

# Log markers: one line per fact, `se.<what> key=value ...` (values never contain spaces).
DECISION_MARKER = "se.decision eventId=%s eventType=%s action=%s rule=%s state=%s"
APPROVAL_MARKER = "se.approval eventId=%s eventType=%s outcome=%s vmId=%s latencySeconds=%s"
QUARANTINE_MARKER = "se.quarantined origin=%s vmId=%s count=%d"
QUARANTINES_PER_LINE = 100  # VMs named in one `se.quarantined` line (each with its count in the batch)
ALERT_MARKER = "se.alert kind=%s outcome=%s"
STORE_ERROR_MARKER = "se.store_error operation=%s"
OPERATOR_MARKER = "se.operator eventId=%s action=%s operator=%s reason=%s"  # the reason (last) has spaces
# read by the Azure Monitor alert rules too (infra/app/alerts.bicep; tests/central holds them together)
HEARTBEAT_MARKER = "se.heartbeat vmId=%s name=%s backlog=%d"
HEARTBEATS_PER_LINE = 100  # VMs named in one `se.heartbeat` line (a billed record each; ~12 KB at most)
OUTBOX_DROPPED_MARKER = "se.outbox_dropped vmId=%s name=%s dropped=%d previously=%d"

ENVELOPE_TYPES = frozenset({"incarnation", "heartbeat", "quarantined", "approvalresult", "invalid"})
EVENT_TYPES = frozenset({"Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"})
ORIGINS = frozenset({"forwarder", "central", "platform"})
OTHER = "other"
_CLOUDEVENT_TYPE = re.compile(r"^scheduledevents\.([a-z]+)\.v\d+$")
_SPACE = re.compile(r"\s+")


class Bounded:
    """Maps free-form attribute values onto at most `limit` distinct values (+ "other"), each cut to
    `width` characters: a misbehaving caller or a huge policy cannot create unbounded series."""

    def __init__(self, limit: int, width: int = 64, allowed: Optional[FrozenSet[str]] = None) -> None:
        self.limit = limit
        self.width = width
        self.allowed = allowed
        self._seen: Dict[str, None] = {}

    def __call__(self, value: Optional[str]) -> str:
        text = _SPACE.sub("_", str(value or "")).strip()[: self.width] or "none"
        if self.allowed is not None:
            return text if text in self.allowed else OTHER
        if text in self._seen:
            return text
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen[text] = None
        return text


def envelope_kind(envelope_type: str) -> str:
    """`scheduledevents.heartbeat.v1` -> `heartbeat`; a short name passes; anything else is "other"."""
    match = _CLOUDEVENT_TYPE.match(envelope_type or "")
    kind = match.group(1) if match else envelope_type
    return kind if kind in ENVELOPE_TYPES else OTHER


def _seconds(start: Optional[datetime], end: Optional[datetime]) -> Optional[float]:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def _word(value: Any) -> str:
    """A log marker value: never empty, never with spaces (the workbook's regexes read up to a space)."""
    return _SPACE.sub("_", str(value)) if value not in (None, "") else "-"


class CentralMetrics:
    """The instruments on one meter, and the typed calls central makes."""

    def __init__(self, meter: otel.Meter) -> None:
        self._envelopes = meter.create_counter(ENVELOPES, unit="{envelope}",
                                               description="Envelopes central processed, by type")
        self._quarantines = meter.create_counter(QUARANTINES, unit="{document}",
                                                 description="Quarantined documents, by origin")
        self._decisions = meter.create_counter(DECISIONS, unit="{decision}",
                                               description="Decisions taken, by action and policy rule")
        self._approvals = meter.create_counter(APPROVALS, unit="{approval}",
                                               description="Approval messages sent and their results")
        self._alerts = meter.create_counter(ALERTS, unit="{alert}", description="Alerts sent or failed")
        self._store_errors = meter.create_counter(STORE_ERRORS, unit="{error}",
                                                  description="Log store (Tables) errors, by operation")
        self._decision_latency = meter.create_histogram(
            DECISION_LATENCY, unit="s", description="Event first seen by central -> approval message sent")
        self._approval_latency = meter.create_histogram(
            APPROVAL_LATENCY, unit="s", description="Approval message sent -> the VM's result received")
        self._action = Bounded(16)
        self._rule = Bounded(64)
        self._alert_kind = Bounded(16)
        self._operation = Bounded(16)
        self._event_type = Bounded(0, allowed=EVENT_TYPES)
        self._origin = Bounded(0, allowed=ORIGINS)

    def envelope(self, envelope_type: str) -> None:
        self._envelopes.add(1, {"type": envelope_kind(envelope_type)})

    def quarantine(self, origin: str) -> None:
        self._quarantines.add(1, {"origin": self._origin(origin)})

    def decision(self, action: str, rule: str, *, event_id: str, event_type: str, state: str) -> None:
        self._decisions.add(1, {"action": self._action(action), "rule": self._rule(rule)})
        log.info(DECISION_MARKER, _word(event_id), _word(event_type), _word(action), _word(rule),
                 _word(state))

    def approval_sent(self, *, event_id: str, event_type: str, vm_id: str,
                      first_seen: Optional[datetime], sent_at: datetime) -> None:
        self._approvals.add(1, {"outcome": "sent"})
        latency = _seconds(first_seen, sent_at)
        if latency is not None:
            self._decision_latency.record(latency, {"event_type": self._event_type(event_type)})
        self._approval_log(event_id, event_type, "sent", vm_id, latency)

    def approval_result(self, confirmed: bool, *, event_id: str, event_type: str, vm_id: str,
                        sent_at: Optional[datetime], result_at: datetime) -> None:
        outcome = "confirmed" if confirmed else "failed"
        self._approvals.add(1, {"outcome": outcome})
        latency = _seconds(sent_at, result_at)
        if latency is not None:
            attributes = {"event_type": self._event_type(event_type), "outcome": outcome}
            self._approval_latency.record(latency, attributes)
        self._approval_log(event_id, event_type, outcome, vm_id, latency)

    def approval_failed_over(self, *, event_id: str, event_type: str, from_vm_id: str) -> None:
        self._approvals.add(1, {"outcome": "failed_over"})
        self._approval_log(event_id, event_type, "failed_over", from_vm_id, None)

    def _approval_log(self, event_id: str, event_type: str, outcome: str, vm_id: str,
                      latency: Optional[float]) -> None:
        level = logging.WARNING if outcome in ("failed", "failed_over") else logging.INFO
        log.log(level, APPROVAL_MARKER, _word(event_id), _word(event_type), outcome, _word(vm_id),
                "-" if latency is None else f"{latency:.3f}")

    def alert(self, kind: str, outcome: str) -> None:
        """outcome: sent, logged (no webhook configured: the default, not a failure) or failed."""
        self._alerts.add(1, {"kind": self._alert_kind(kind), "outcome": outcome})
        log.log(logging.WARNING if outcome == "failed" else logging.INFO, ALERT_MARKER, _word(kind), outcome)

    def store_error(self, operation: str) -> None:
        self._store_errors.add(1, {"operation": self._operation(operation)})
        log.warning(STORE_ERROR_MARKER, _word(operation))


_active = CentralMetrics(otel.get_meter(METER_NAME))  # the global (proxy) meter: no-op until configured


def use(meter_provider: otel.MeterProvider) -> CentralMetrics:
    """Record on `meter_provider` from now on (tests: an InMemoryMetricReader's provider); returns the
    previous instance so a caller can put it back with `restore`."""
    global _active
    previous = _active
    _active = CentralMetrics(meter_provider.get_meter(METER_NAME))
    return previous


def restore(instance: CentralMetrics) -> None:
    global _active
    _active = instance


def client_id_of(authentication_string: str) -> Optional[str]:
    """`ClientId=<guid>;Authorization=AAD` (APPLICATIONINSIGHTS_AUTHENTICATION_STRING) -> the guid;
    None when it does not ask for Entra ID auth."""
    parts: Dict[str, str] = {}
    for item in (authentication_string or "").split(";"):
        key, _, value = item.partition("=")
        parts[key.strip().lower()] = value.strip()
    if parts.get("authorization", "").upper() != "AAD":
        return None
    return parts.get("clientid") or ""


# Auto-instrumentations the distro would otherwise turn on: central's Azure SDK and HTTP calls are not
# what this module reports, and the Functions host already records invocations.
_INSTRUMENTATIONS: Iterable[str] = ("azure_sdk", "django", "fastapi", "flask", "psycopg2", "requests",
                                    "urllib", "urllib3")
_NO_LOGS_LOGGER = "central.metrics.azure-monitor-logs-off"


def configure(connection_string: str, authentication_string: str = "") -> bool:
    """Send these metrics to Application Insights with Microsoft's distro (azure-monitor-opentelemetry),
    as Microsoft documents for Python Function apps; a no-op returning False without a connection string.

    Metrics only: the Functions host already ships the app's log lines (the `se.*` markers) to
    Application Insights, so the distro's log handler goes on a logger nothing writes to (no line twice)
    and its auto-instrumentations stay off. With local auth disabled on the component, telemetry needs
    Entra ID: `authentication_string` = APPLICATIONINSIGHTS_AUTHENTICATION_STRING
    (`ClientId=<user-assigned identity>;Authorization=AAD`).
    """
    if not connection_string:
        return False
    from azure.monitor.opentelemetry import configure_azure_monitor

    options: Dict[str, Any] = {
        "connection_string": connection_string,
        "logger_name": _NO_LOGS_LOGGER,
        "instrumentation_options": {name: {"enabled": False} for name in _INSTRUMENTATIONS},
        "enable_live_metrics": False,
    }
    client_id = client_id_of(authentication_string)
    if client_id is not None:
        from azure.identity import ManagedIdentityCredential

        options["credential"] = ManagedIdentityCredential(client_id=client_id or None)
    configure_azure_monitor(**options)
    return True


# ---- the calls central makes (module level, so call sites stay one line) ---------------------------

def heartbeat_lines(entries: List[Tuple[str, str, int]]) -> List[str]:
    """`se.heartbeat` lines for (vmId, name, backlog) entries, HEARTBEATS_PER_LINE VMs per line: the
    marker once, then each VM's `vmId=.. name=.. backlog=..` (names and ids have no spaces). One
    Application Insights record per batch instead of one per VM: the record's ~500 billed bytes of
    columns were most of the log bill (docs/sizing.md); the alert and workbook queries expand it."""
    fields = HEARTBEAT_MARKER.split(" ", 1)[1]
    return ["se.heartbeat " + " ".join(fields % (vm_id, _word(name), backlog)
                                       for vm_id, name, backlog in entries[i:i + HEARTBEATS_PER_LINE])
            for i in range(0, len(entries), HEARTBEATS_PER_LINE)]


def envelope(envelope_type: str) -> None:
    _active.envelope(envelope_type)


def quarantine(origin: str) -> None:
    """Count one quarantined envelope (its `se.quarantined` line: quarantine_lines, once per batch)."""
    _active.quarantine(origin)


def log_quarantines(entries: List[Tuple[str, str]]) -> None:
    """quarantine_lines, logged (WARNING)."""
    for line in quarantine_lines(entries):
        log.warning("%s", line)


def quarantine_lines(entries: List[Tuple[str, str]]) -> List[str]:
    """`se.quarantined` lines for (origin, vmId) entries, one entry per envelope quarantined in a batch: per
    origin, each VM once with its count, QUARANTINES_PER_LINE VMs per line. A flood of refused envelopes (a
    trust failure fleet-wide, or forgeries from anything that may send to the hub) is then a few records a
    batch, not one per envelope, whoever sends them; the Quarantine table keeps each envelope."""
    counts: Dict[str, Dict[str, int]] = {}
    for origin, vm_id in entries:
        per_vm = counts.setdefault(_word(origin), {})
        per_vm[_word(vm_id)] = per_vm.get(_word(vm_id), 0) + 1
    fields = QUARANTINE_MARKER.split(" ", 2)[2]
    lines = []
    for origin, per_vm in counts.items():
        vms = list(per_vm.items())
        for i in range(0, len(vms), QUARANTINES_PER_LINE):
            lines.append(f"se.quarantined origin={origin} " + " ".join(
                fields % (vm_id, n) for vm_id, n in vms[i:i + QUARANTINES_PER_LINE]))
    return lines


def decision(action: str, rule: str, *, event_id: str, event_type: str, state: str) -> None:
    _active.decision(action, rule, event_id=event_id, event_type=event_type, state=state)


def approval_sent(*, event_id: str, event_type: str, vm_id: str, first_seen: Optional[datetime],
                  sent_at: datetime) -> None:
    _active.approval_sent(event_id=event_id, event_type=event_type, vm_id=vm_id, first_seen=first_seen,
                          sent_at=sent_at)


def approval_result(confirmed: bool, *, event_id: str, event_type: str, vm_id: str,
                    sent_at: Optional[datetime], result_at: datetime) -> None:
    _active.approval_result(confirmed, event_id=event_id, event_type=event_type, vm_id=vm_id, sent_at=sent_at,
                            result_at=result_at)


def approval_failed_over(*, event_id: str, event_type: str, from_vm_id: str) -> None:
    _active.approval_failed_over(event_id=event_id, event_type=event_type, from_vm_id=from_vm_id)


def alert(kind: str, outcome: str) -> None:
    _active.alert(kind, outcome)


def store_error(operation: str) -> None:
    _active.store_error(operation)
