"""CentralService: the one object function_app.py uses (Event Hubs batch, timer, HTTP).

Processing order inside one call: parse and apply every envelope (in memory), decide for the events
touched, send approvals (claim first, so two instances never both send), send alerts (claimed the
same way), then flush the log store once (a transaction per table partition). A lock serialises
calls, since the Functions worker may run the timer and the trigger on different threads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Set, Union

from azure.core.exceptions import AzureError

from . import envelopes as env_mod
from . import policy as policy_mod
from . import rows
from .alerts import Alert, Delivery, WebhookAlerter
from .approvals import ApprovalSender, build_message, queue_name
from .envelopes import BadEnvelope, Envelope
from .leader import elect
from .registry import Approval, EventRecord
from .settings import CentralSettings, CountingTransport, storage_clients
from .store import StoreError, TableLog
from .timeutil import aware, iso
from .vms import VmState

log = logging.getLogger(__name__)

# Seconds a claimed-but-unmarked approval may be in flight at another instance before an adopter
# re-sends it (the claimer crashed between claim and send).
CLAIM_SEND_GRACE = 30

# Seconds between two `se.heartbeat` log markers of one VM; must stay well under the heartbeat-missing
# alert's window (infra parameter heartbeatMissingMinutes, default 15).
HEARTBEAT_LOG_EVERY = 300

SEEN_LIMIT = 200_000  # envelope ids remembered for exact-duplicate drops
UNSENT_LIMIT = 1_000  # failed alerts kept for the timer to retry
ALERT_ROUNDS = 5  # delivery rounds per alert (the first call + timer retries)
ALERT_CLAIMS = "alerts"  # the Claims partition of alert keys (one transaction claims a call's alerts)
ENDED_KEEP = timedelta(hours=24)  # ended events stay in memory so a late report cannot revive them
DONE_OUTCOMES = ("approved", "completed", "post-hook-failed")
REFUSED_OUTCOMES = ("rejected", "hook-failed")
IMPACTING_STATES = ("approving", "approved", "expired")  # expired: NotBefore passed, starts any moment


class UnknownEvent(LookupError):
    """No event with this EventId is known (HTTP 404)."""


class InvalidRequest(ValueError):
    """The operator request cannot be carried out as asked (HTTP 400/409); the message says why."""


@dataclass
class Decision:
    event_id: str
    action: str  # approve | approve-after-hook | approve-in-window | hold | failover | expired | operator-*
    state: str  # the event's state after it (see registry.EventRecord.state)
    rule: str
    reason: str
    severity: str
    decided_by: str
    at: datetime
    leader_vm_id: Optional[str] = None
    leader_vm_name: Optional[str] = None
    message_id: Optional[str] = None
    expires_at: Optional[datetime] = None

    def to_json(self) -> Dict[str, Any]:
        out = asdict(self)
        out["at"] = iso(self.at)
        out["expires_at"] = iso(self.expires_at) if self.expires_at else None
        return out


@dataclass
class BatchResult:
    received: int = 0
    processed: int = 0
    duplicates: int = 0
    stale: int = 0
    quarantined: int = 0
    decisions: List[Decision] = field(default_factory=list)
    approvals_sent: int = 0
    alerts_sent: int = 0
    alerts_failed: int = 0
    transactions: int = 0
    errors: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        out = asdict(self)
        out["decisions"] = [d.to_json() for d in self.decisions]
        return out


class CentralService:
    def __init__(
        self,
        settings: CentralSettings,
        store: TableLog,
        sender: ApprovalSender,
        alerter: WebhookAlerter,
        transport: Optional[CountingTransport] = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.sender = sender
        self.alerter = alerter
        self.transport = transport
        self.liveness = timedelta(seconds=settings.liveness)
        self.result_timeout = timedelta(seconds=settings.result_timeout)
        try:
            self.policy = policy_mod.load(settings.policy_json)
            self.policy_error: Optional[policy_mod.PolicyError] = None
        except policy_mod.PolicyError as exc:
            log.error("%s; holding every event until it is fixed", exc)
            self.policy = policy_mod.fallback(exc)
            self.policy_error = exc
        self.vms: Dict[str, VmState] = {}
        self.by_name: Dict[str, str] = {}
        self.events: Dict[str, EventRecord] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._alerted: Set[str] = set()
        self._unsent: Deque[Alert] = deque(maxlen=UNSENT_LIMIT)
        self._lock = threading.RLock()
        self._loaded = False
        self.counters: Dict[str, int] = {
            k: 0
            for k in (
                "envelopes",
                "duplicates",
                "stale",
                "quarantined",
                "approvals",
                "alertsSent",
                "alertsFailed",
                "storeErrors",
            )
        }
        # per call, reset by _begin()
        self._dirty_events: Set[str] = set()
        self._dirty_vms: Set[str] = set()
        self._alerts: List[Alert] = []
        self._result = BatchResult()
        self._now = aware(None)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_settings(cls, settings: Mapping[str, str], count_requests: bool = False) -> CentralService:
        """Build from app settings (os.environ in Azure; see central/app_settings.json)."""
        typed = CentralSettings.from_mapping(settings)
        transport = CountingTransport() if count_requests else None
        tables, queues = storage_clients(settings, transport=transport)
        alerter = WebhookAlerter(
            url=typed.webhook_url,
            fmt=typed.webhook_format,
            max_attempts=typed.alert_attempts,
            backoff=typed.alert_backoff,
            timeout=typed.alert_timeout,
        )
        return cls(typed, TableLog(tables, typed.table_prefix), ApprovalSender(queues), alerter, transport)

    def _ensure_loaded(self) -> None:
        """Once per instance: the VMs and the open (or recently ended) events from the log store."""
        if self._loaded:
            return
        for e in self.store.all_rows("Vms"):
            vm = rows.vm_from_entity(e)
            self.vms[vm.vm_id] = vm
            if vm.name:
                self.by_name[vm.name] = vm.vm_id
        since = self._now - ENDED_KEEP
        for e in self.store.query("Events", "Ended eq false or EndedAt ge @since", {"since": since}):
            rec = rows.event_from_entity(e)
            self.events[rec.event_id] = rec
        self._loaded = True

    def _policy_alert(self) -> None:
        if self.policy_error is not None:
            digest = hashlib.sha256(str(self.policy_error.errors).encode()).hexdigest()[:16]
            self._alert(
                Alert(
                    f"policy-invalid:{digest}",
                    "policy-invalid",
                    "critical",
                    "Central policy is invalid: every event is held",
                    str(self.policy_error),
                    self._now,
                    facts={"errors": self.policy_error.errors[:5]},
                )
            )

    # ---- the public operations -------------------------------------------------------------------
    def handle_batch(
        self, bodies: Sequence[Union[bytes, str]], now: Optional[datetime] = None
    ) -> BatchResult:
        """Process one Event Hubs batch. Bad envelopes are quarantined; the rest go on.
        Raises StoreError only when the log store cannot be written (rows are kept for the next call)."""
        with self._lock:
            self._begin(now)
            self._result.received = len(bodies)
            for body in bodies:
                try:
                    self._one(body)
                except (KeyError, TypeError, ValueError) as exc:  # valid by schema yet unusable: keep it
                    self._quarantine(
                        BadEnvelope(
                            env_mod._text(body),
                            [{"path": "/", "message": f"{exc}"[:300]}],
                            hashlib.sha256(env_mod._text(body).encode()).hexdigest(),
                        )
                    )
            for event_id in sorted(self._dirty_events):
                self._evaluate_safely(self.events[event_id])
            return self._finish()

    def reevaluate(self, now: Optional[datetime] = None) -> List[Decision]:
        """Timer: windows opening, budgets freeing, silent leaders (failover), NotBefore passing."""
        with self._lock:
            self._begin(now)
            while self._unsent:  # alerts whose webhook failed earlier: another round
                self._alerts.append(self._unsent.popleft())
            for rec in sorted(self.events.values(), key=lambda r: r.first_seen):
                if not rec.ended:
                    self._evaluate_safely(rec)
            self._forget_old()
            return self._finish().decisions

    def pending(self) -> List[Dict[str, Any]]:
        """Events not ended, oldest first, with status, state, decision and current leader."""
        with self._lock:
            self._touch(None)
            return [r.view() for r in sorted(self.events.values(), key=lambda r: r.first_seen) if not r.ended]

    def decide(
        self, event_id: str, action: str, operator: str, reason: str, now: Optional[datetime] = None
    ) -> Dict[str, Any]:
        """An operator's decision: "approve" (now, to the elected leader; windows and budgets do not
        apply) or "hold" (no automatic approval until an operator approves)."""
        if action not in ("approve", "hold"):
            raise InvalidRequest(f"action must be 'approve' or 'hold', not {action!r}")
        if not operator.strip():
            raise InvalidRequest("operator is required (who decides)")
        with self._lock:
            self._begin(now)
            rec = self.events.get(event_id)
            if rec is None:
                raise UnknownEvent(f"no event {event_id!r} is known to central")
            by = f"operator:{operator.strip()[:200]}"
            why = reason.strip() or "(no reason given)"
            if action == "hold":
                rec.operator_hold = True
                note = ""
                if rec.outstanding is not None:
                    note = (
                        f"; an approval already sent to {rec.outstanding.vm_name} cannot be recalled "
                        f"(it expires at {iso(rec.outstanding.expires_at)})"
                    )
                self._record(rec, "operator-hold", "held", by, why + note, "warning", by)
            else:
                problem = self._unapprovable(rec)
                if problem:
                    raise InvalidRequest(f"cannot approve {event_id}: {problem}")
                rec.operator_hold = False
                if rec.outstanding is None:
                    sent = self._send_approval(rec, "approve", by, why, "operator-approve", "warning")
                    if not sent and rec.outstanding is None:  # (an adopted approval counts as sent)
                        detail = (
                            self._result.errors[-1] if self._result.errors else rec.decision.get("reason")
                        )
                        self._finish()  # the decision and any alert are still recorded
                        raise InvalidRequest(f"cannot approve {event_id}: {detail}")
            self._dirty_events.add(rec.event_id)
            self._finish()
            return rec.view()

    def health(self) -> Dict[str, Any]:
        with self._lock:
            storage = "ok"
            try:
                self._touch(None)
            except (AzureError, StoreError) as exc:
                storage = f"error: {exc}"[:300]
            open_events = [r for r in self.events.values() if not r.ended]
            return {
                "status": "ok" if storage == "ok" and self.policy_error is None else "degraded",
                "storage": storage,
                "policy": self.policy.describe(),
                "webhook": {
                    "configured": bool(self.settings.webhook_url),
                    "format": self.settings.webhook_format,
                },
                "openEvents": len(open_events),
                "knownVms": len(self.vms),
                "liveVms": sum(1 for v in self.vms.values() if v.live(self._now, self.liveness)),
                "stagedRows": self.store.staged_count,
                "counters": dict(self.counters),
                "storageRequests": self.transport.requests if self.transport else None,
            }

    # ---- one call's bookkeeping ------------------------------------------------------------------
    def _begin(self, now: Optional[datetime]) -> None:
        self._now = aware(now)
        self._result = BatchResult()
        self._dirty_events = set()
        self._dirty_vms = set()
        self._alerts = []
        self.alerter.new_batch()
        self._ensure_loaded()
        self._policy_alert()

    def _touch(self, now: Optional[datetime]) -> None:
        """For read-only calls: set the clock and load state, without starting a batch."""
        self._now = aware(now)
        self._ensure_loaded()

    def _finish(self) -> BatchResult:
        result = self._result
        fresh = [a.key for a in self._alerts if a.rounds == 0]
        try:  # one transaction claims every new alert of this call (exactly-once across instances)
            held: Optional[Set[str]] = self.store.claim_many(fresh, ALERT_CLAIMS, At=self._now)
        except StoreError as exc:
            log.warning("alert claims failed, sending anyway: %s", exc)
            held = None
        for alert in self._alerts:
            if alert.rounds == 0 and held is not None and alert.key not in held:
                self._alerted.add(alert.key)  # another instance sent it (or this one before a crash)
                # its Alerts row may never have been written (a crash between POST and flush)
                self.store.stage("Alerts", rows.alert_entity(alert, None, self.alerter.fmt))
                continue
            self._deliver(alert)
        for event_id in self._dirty_events:
            self.store.stage("Events", rows.event_entity(self.events[event_id]))
        for vm_id in self._dirty_vms:
            self.store.stage("Vms", rows.vm_entity(self.vms[vm_id]))
        try:
            result.transactions = self.store.flush()
        except StoreError as exc:
            self.counters["storeErrors"] += 1
            result.errors.append(str(exc))
            raise
        finally:
            self._alerts = []
        return result

    # ---- envelopes ---------------------------------------------------------------------------
    def _one(self, body: Union[bytes, str]) -> None:
        item = env_mod.parse_body(body)
        if isinstance(item, BadEnvelope):
            self._quarantine(item)
            return
        key = f"{item.vm_id}|{item.id}"
        if key in self._seen:
            self._result.duplicates += 1
            self.counters["duplicates"] += 1
            return
        self._seen[key] = None
        if len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)
        self._result.processed += 1
        self.counters["envelopes"] += 1
        vm = self._vm(item)
        if item.type == env_mod.INCARNATION:
            self._incarnation(item, vm)
        elif item.type == env_mod.HEARTBEAT:
            self._heartbeat(item, vm)
        elif item.type == env_mod.QUARANTINED:
            self._forwarder_quarantine(item)
        elif item.type == env_mod.APPROVAL_RESULT:
            self._approval_result(item)

    def _vm(self, env: Envelope) -> VmState:
        vm = self.vms.get(env.vm_id)
        if vm is None:
            vm = self.vms[env.vm_id] = VmState(env.vm_id, env.vm_name)
        vm.update_identity(env.vm)
        vm.seen(min(env.time, self._now))  # a fast clock on a VM must not make it look live forever
        self.by_name[vm.name] = vm.vm_id
        self._dirty_vms.add(vm.vm_id)
        return vm

    def _newer(self, vm: VmState, env: Envelope) -> bool:
        """Apply this incarnation? Only if it is newer than what is applied, or a reset observed later."""
        inc = env.data["incarnation"]
        if vm.incarnation is None or inc > vm.incarnation:
            return True
        observed = env.time
        return (
            bool(env.data.get("reset"))
            and vm.incarnation_observed is not None
            and observed > vm.incarnation_observed
        )

    def _incarnation(self, env: Envelope, vm: VmState) -> None:
        applied = self._newer(vm, env)
        self.store.stage("Incarnations", rows.incarnation_entity(env, applied, self._now))
        if not applied:
            self._result.stale += 1
            self.counters["stale"] += 1
            return
        document = env.data.get("document") or {}
        listed: List[str] = []
        for event in document.get("Events") or []:
            event_id = event["EventId"]
            listed.append(event_id)
            rec = self.events.get(event_id)
            if rec is None:
                rec = EventRecord(event_id=event_id, first_seen=self._now, partition=rows.month(self._now))
                self.events[event_id] = rec
            moved = rec.absorb(event, vm.vm_id, vm.name, self._now)
            self._dirty_events.add(event_id)
            if moved:
                outstanding = rec.outstanding  # a property: None as soon as its result is set
                if rec.status == "Started" and outstanding is not None:
                    # it started (approved by the leader, another VM, or NotBefore): nothing is outstanding
                    outstanding.result = "event-started"
                    outstanding.result_at = self._now
                self._status_alert(rec)
        for event_id in vm.listed:
            if event_id in listed or event_id not in self.events:
                continue
            rec = self.events[event_id]
            if rec.unlisted_by(vm.vm_id, self._now):
                self._status_alert(rec)
            self._dirty_events.add(event_id)
        vm.incarnation = env.data["incarnation"]
        vm.incarnation_observed = env.time
        vm.listed = listed

    def _log_heartbeat_marker(self, vm: VmState) -> None:
        """One `se.heartbeat` line per VM per HEARTBEAT_LOG_EVERY: the Azure Monitor "heartbeats
        missing" alert (infra/app/alerts.bicep) reads it; throttled so a fleet does not flood the logs."""
        last = vm.heartbeat_logged
        if last is None or (self._now - last).total_seconds() >= HEARTBEAT_LOG_EVERY:
            vm.heartbeat_logged = self._now
            log.info("se.heartbeat vmId=%s name=%s backlog=%d", vm.vm_id, vm.name, vm.outbox_backlog)

    def _heartbeat(self, env: Envelope, vm: VmState) -> None:
        outbox = env.data.get("outbox") or {}
        moment = min(env.time, self._now)
        if vm.last_heartbeat is None or moment >= vm.last_heartbeat:  # an older heartbeat changes nothing
            vm.last_heartbeat = moment
            vm.outbox_backlog = int(outbox.get("backlog", 0))
            vm.forwarder_version = (env.data.get("forwarder") or {}).get("version", vm.forwarder_version)
        self._log_heartbeat_marker(vm)
        dropped = int(outbox.get("dropped", 0))
        if dropped > vm.outbox_dropped:
            # Marker for the Azure Monitor "outbox drops" log alert (infra/app/alerts.bicep).
            log.warning("se.outbox_dropped vmId=%s name=%s dropped=%d previously=%d",
                        vm.vm_id, vm.name, dropped, vm.outbox_dropped)
            self._alert(
                Alert(
                    f"outbox-dropped:{vm.vm_id}:{dropped}",
                    "outbox-dropped",
                    "critical",
                    f"Forwarder on {vm.name} dropped envelopes",
                    f"The bounded outbox on {vm.name} dropped {dropped - vm.outbox_dropped} envelope(s) "
                    f"({dropped} since install): Event Hubs was unreachable for long. "
                    "Incarnations may be missing.",
                    self._now,
                    facts={
                        "vm": vm.name,
                        "vmId": vm.vm_id,
                        "dropped": dropped,
                        "previously": vm.outbox_dropped,
                        "lastError": outbox.get("lastError"),
                    },
                )
            )
            vm.outbox_dropped = dropped

    def _quarantine(self, bad: BadEnvelope) -> None:
        self._result.quarantined += 1
        self.counters["quarantined"] += 1
        self.store.stage("Quarantine", rows.quarantine_central(bad, self._now))
        first = bad.errors[0] if bad.errors else {"path": "/", "message": "?"}
        self._alert(
            Alert(
                f"quarantined:central:{bad.sha256[:32]}",
                "quarantined",
                "warning",
                "Central quarantined an envelope it could not accept",
                f"{first['path']}: {first['message']}",
                self._now,
                facts={
                    "vmId": bad.vm_id,
                    "envelopeId": bad.envelope_id,
                    "sha256": bad.sha256,
                    "errors": len(bad.errors),
                },
            )
        )

    def _forwarder_quarantine(self, env: Envelope) -> None:
        self._result.quarantined += 1
        self.counters["quarantined"] += 1
        entity = rows.quarantine_forwarder(env, self._now)
        self.store.stage("Quarantine", entity)
        errs = env.data.get("errors") or [{"path": "/", "message": "?"}]
        self._alert(
            Alert(
                f"quarantined:{env.vm_id}:{entity['Sha256'][:32]}",
                "quarantined",
                "warning",
                f"IMDS on {env.vm_name} returned a document that fails the schema",
                f"{errs[0]['path']}: {errs[0]['message']}",
                self._now,
                facts={"vm": env.vm_name, "vmId": env.vm_id, "errors": len(errs)},
            )
        )

    def _approval_result(self, env: Envelope) -> None:
        d = env.data
        self.store.stage("Decisions", rows.result_entity(env, self._now))
        rec = self.events.get(d["eventId"])
        if rec is None:
            log.warning("approval result for unknown event %s from %s", d["eventId"], env.vm_name)
            return
        attempt: Optional[Approval] = None
        for a in rec.approvals:
            if d.get("messageId") and a.message_id == d["messageId"]:
                attempt = a
        if attempt is None and d.get("messageId") is None:
            attempt = rec.outstanding
        if attempt is not None:
            if attempt.result not in (None, "timeout", "event-started"):
                return  # already recorded
            attempt.result = d["outcome"]
            attempt.result_at = self._now
        rec.outcome = d["outcome"]
        rec.outcome_at = self._now
        rec.outcome_vm = env.vm_name
        self._dirty_events.add(rec.event_id)
        if d["outcome"] in DONE_OUTCOMES:
            rec.state = "approved"
        elif d["outcome"] in REFUSED_OUTCOMES:
            rec.state = "approval-failed"
            self._record(
                rec,
                "approval-failed",
                "approval-failed",
                "forwarder",
                f"{env.vm_name} reported {d['outcome']}: {d.get('reason', '')}",
                "critical",
                f"vm:{env.vm_name}",
            )
            self._alert(
                Alert(
                    f"{rec.event_id}:approval-failed",
                    "approval-failed",
                    "critical",
                    f"{rec.event_type} {rec.event_id}: approval failed on {env.vm_name}",
                    f"{d['outcome']}: {d.get('reason', '')}. The event starts at NotBefore.",
                    self._now,
                    rec.event_id,
                    rec.status,
                    self._facts(rec),
                )
            )
        # post-failed: the next evaluation fails over to another live VM

    # ---- decisions ------------------------------------------------------------------------------
    def _unapprovable(self, rec: EventRecord) -> str:
        if rec.ended:
            return f"it has ended ({rec.status})"
        if rec.status != "Scheduled":
            return f"it is {rec.status}, not Scheduled"
        if rec.not_before is not None and self._now >= rec.not_before:
            return f"its NotBefore ({iso(rec.not_before)}) has passed"
        return ""

    def _evaluate_safely(self, rec: EventRecord) -> None:
        """One event's evaluation failing (Storage down for a claim) must not stop the others."""
        try:
            self._evaluate(rec)
        except (AzureError, StoreError, ValueError) as exc:
            self._result.errors.append(f"{rec.event_id}: {exc}"[:500])
            log.error("evaluating %s failed (the timer retries): %s", rec.event_id, exc)

    def _evaluate(self, rec: EventRecord) -> None:
        if rec.ended or rec.status != "Scheduled":
            return
        if rec.not_before is not None and self._now >= rec.not_before:
            if rec.state not in ("approved", "expired"):
                rec.state = "expired"
                self._record(
                    rec,
                    "expired",
                    "expired",
                    "notbefore",
                    f"NotBefore {iso(rec.not_before)} passed without a confirmed approval; Azure starts it",
                    "info",
                    "policy:notbefore",
                )
            return
        out = rec.outstanding
        if out is not None:
            if self._now < out.expires_at:
                return  # waiting for the leader's result
            out.result = "timeout"
            out.result_at = self._now
            self._dirty_events.add(rec.event_id)
        if rec.operator_hold or rec.state in ("approved", "approval-failed"):
            return
        vms = self._resource_vms(rec)
        rule = self.policy.rule_for(rec.event_type, rec.event_source, rec.duration, vms)
        by = f"policy:{rule.name}"
        failover = bool(rec.approvals) and rec.approvals[-1].result in ("timeout", "post-failed")
        if rule.action == "hold":
            why = (
                ("policy invalid: " + str(self.policy_error)[:500])
                if self.policy_error
                else "policy holds it"
            )
            self._record(rec, "hold", "held", rule.name, why + "; left to NotBefore", rule.severity, by)
            return
        msg_action = "hook-then-approve" if rule.action == "approve-after-hook" else "approve"
        if rule.action == "approve-in-window":
            window = self.policy.windows[rule.window or ""]
            msg_action = "hook-then-approve" if rule.hook else "approve"
            if not window.contains(self._now):
                nxt = window.next_open(self._now)
                self._record(
                    rec,
                    "approve-in-window",
                    "waiting-window",
                    rule.name,
                    f"waiting for window {window.name} (next opens {iso(nxt) if nxt else 'never'})",
                    rule.severity,
                    by,
                )
                return
        wait = self._budget_wait(rec, rule, vms)
        if wait:
            self._record(rec, rule.action, "waiting-budget", rule.name, wait, rule.severity, by)
            return
        action = "failover" if failover else rule.action
        self._send_approval(rec, msg_action, by, f"rule {rule.name}: {rule.action}", action, rule.severity)

    def _resource_vms(self, rec: EventRecord) -> List[VmState]:
        out = []
        for name in rec.resources:
            vm_id = self.by_name.get(name)
            if vm_id in self.vms:
                out.append(self.vms[vm_id])
        return out

    def _budget_wait(self, rec: EventRecord, rule: policy_mod.Rule, vms: List[VmState]) -> str:
        """Why this event must wait for a disruption budget ('' when it may go)."""
        budgets = self.policy.budgets_of(rule)
        if not budgets:
            return ""
        impacted: Dict[str, Set[str]] = {}
        for other in self.events.values():
            if other.event_id == rec.event_id or other.ended:
                continue
            if other.status != "Started" and other.state not in IMPACTING_STATES:
                continue
            for vm in self._resource_vms(other):
                for b in budgets:
                    group = b.group_of(vm)
                    if group:
                        impacted.setdefault(group, set()).add(vm.vm_id)
        for b in budgets:
            mine: Dict[str, Set[str]] = {}
            for vm in vms:
                group = b.group_of(vm)
                if group:
                    mine.setdefault(group, set()).add(vm.vm_id)
            for group, members in sorted(mine.items()):
                busy = impacted.get(group, set()) - members
                if len(busy) + len(members) > b.max_impacted:
                    if not busy:
                        return (
                            f"budget {b.name}: this event alone affects {len(members)} VMs of {group}, "
                            f"more than {b.max_impacted}; held until NotBefore or an operator approves"
                        )
                    return (
                        f"budget {b.name}: {len(busy)} VM(s) of {group} already impacted, "
                        f"{len(members)} more would pass {b.max_impacted}"
                    )
        return ""

    def _send_approval(
        self, rec: EventRecord, msg_action: str, by: str, why: str, action: str, severity: str
    ) -> bool:
        leader = elect(
            rec, {n: self.vms[i] for n, i in self.by_name.items() if i in self.vms}, self._now, self.liveness
        )
        if leader is None:
            self._record(
                rec,
                action,
                "no-leader",
                by.split(":", 1)[-1],
                "no live forwarder among Resources "
                + ", ".join(rec.resources[:10])
                + "; waiting (left to NotBefore if none comes)",
                "critical",
                by,
            )
            self._alert(
                Alert(
                    f"{rec.event_id}:no-leader",
                    "no-leader",
                    "critical",
                    f"{rec.event_type} {rec.event_id}: no live VM can approve it",
                    "No VM in Resources has a live forwarder; the event starts at NotBefore.",
                    self._now,
                    rec.event_id,
                    rec.status,
                    self._facts(rec),
                )
            )
            return False
        expires = self._now + self.result_timeout
        if rec.not_before is not None:
            expires = min(expires, rec.not_before)
        if (expires - self._now).total_seconds() < 1:
            self._record(rec, action, "expired", by, "too close to NotBefore to send an approval", "info", by)
            return False
        attempt = len(rec.approvals) + 1
        incarnation = leader.incarnation if leader.incarnation is not None else -1
        message = build_message(
            rec.event_id, leader.vm_id, leader.name, msg_action, by, why, incarnation, self._now, expires
        )
        claim_key, claim_partition = f"{rec.event_id}:approval:{attempt}", rows.claim_partition(rec.event_id)
        claim = {
            "VmId": leader.vm_id,
            "VmName": leader.name,
            "MessageId": message["messageId"],
            "Action": msg_action,
            "DecidedBy": by,
            "At": self._now,
            "ExpiresAt": expires,
            "Message": json.dumps(message, separators=(",", ":")),  # so an adopter can re-send it
        }
        if not self.store.claim(claim_key, claim_partition, **claim):
            # another instance (or this one before a restart) sent attempt N: adopt it, so its
            # expiry and failover are tracked here too and attempt N+1 never overlaps it
            self._adopt(rec, attempt, self.store.read_claim(claim_key, claim_partition))
            return False
        try:
            queue = self.sender.send(message, self._now, expires)
        except AzureError as exc:
            # not sent: give the claim back so the next evaluation (timer) can try again
            self.store.release(claim_key, claim_partition)
            self._result.errors.append(f"approval for {rec.event_id} not sent: {exc}"[:500])
            log.error("approval for %s to %s not sent: %s", rec.event_id, leader.name, exc)
            return False
        self.store.mark_claim(claim_key, claim_partition, Sent=True)
        rec.approvals.append(
            Approval(
                attempt,
                message["messageId"],
                leader.vm_id,
                leader.name,
                queue,
                msg_action,
                by,
                self._now,
                expires,
            )
        )
        self._result.approvals_sent += 1
        self.counters["approvals"] += 1
        reason = f"{why}; approval {attempt} ({msg_action}) to leader {leader.name}, expires {iso(expires)}"
        if action == "failover":
            prev = rec.approvals[-2]
            reason = f"leader {prev.vm_name} gave no result ({prev.result}); " + reason
        self._record(
            rec,
            action,
            "approving",
            by.split(":", 1)[-1],
            reason,
            severity,
            by,
            leader=leader,
            message_id=message["messageId"],
            expires=expires,
            force=True,
        )
        return True

    def _adopt(self, rec: EventRecord, attempt: int, claim: Optional[Dict[str, Any]]) -> None:
        if claim is None:  # claimed and released in between: the next evaluation tries again
            return
        sent_at = aware(claim.get("At")) if isinstance(claim.get("At"), datetime) else self._now
        expires = aware(claim["ExpiresAt"]) if isinstance(claim.get("ExpiresAt"), datetime) else sent_at
        if not claim.get("Sent") and claim.get("Message") and expires > self._now + timedelta(seconds=1):
            # Claimed but never marked sent: the claimer crashed before its send, or is sending now.
            if (self._now - sent_at).total_seconds() < CLAIM_SEND_GRACE:
                return  # maybe in flight: look again at the next evaluation
            try:  # re-send the very message (same messageId): the VM approves an event at most once
                self.sender.send(json.loads(claim["Message"]), self._now, expires)
            except AzureError as exc:
                log.error("approval %d of %s (claimed, unsent) not re-sent: %s", attempt, rec.event_id, exc)
                return
            self.store.mark_claim(f"{rec.event_id}:approval:{attempt}", rows.claim_partition(rec.event_id),
                                  Sent=True)
            log.warning("approval %d of %s was claimed but never sent (a crash?); sent it now",
                        attempt, rec.event_id)
        rec.approvals.append(
            Approval(
                attempt,
                str(claim.get("MessageId", "")),
                str(claim.get("VmId", "")),
                str(claim.get("VmName", "")),
                queue_name(str(claim.get("VmId", ""))),
                str(claim.get("Action", "approve")),
                str(claim.get("DecidedBy", "")),
                sent_at,
                expires,
            )
        )
        rec.state = "approving"
        self._dirty_events.add(rec.event_id)
        log.info(
            "approval %d of %s was sent elsewhere (to %s); tracking it",
            attempt,
            rec.event_id,
            claim.get("VmName"),
        )

    def _record(
        self,
        rec: EventRecord,
        action: str,
        state: str,
        rule: str,
        reason: str,
        severity: str,
        by: str,
        leader: Optional[VmState] = None,
        message_id: Optional[str] = None,
        expires: Optional[datetime] = None,
        force: bool = False,
    ) -> None:
        """Set the event's state and log a decision row, unless it repeats the last one (the timer
        re-evaluates every few minutes; an unchanged verdict is not a new decision)."""
        if not force and rec.state == state and rec.decision.get("reason") == reason:
            return
        rec.state = state
        rec.decision_seq += 1
        decision = {
            "action": action,
            "state": state,
            "rule": rule,
            "reason": reason,
            "severity": severity,
            "decidedBy": by,
            "at": iso(self._now),
            "leaderVmId": leader.vm_id if leader else None,
            "leaderVmName": leader.name if leader else None,
            "messageId": message_id,
            "expiresAt": iso(expires) if expires else None,
        }
        rec.decision = decision
        self.store.stage("Decisions", rows.decision_entity(rec, decision, self._now))
        self._dirty_events.add(rec.event_id)
        self._result.decisions.append(
            Decision(
                rec.event_id,
                action,
                state,
                rule,
                reason,
                severity,
                by,
                self._now,
                leader.vm_id if leader else None,
                leader.name if leader else None,
                message_id,
                expires,
            )
        )

    # ---- alerts -------------------------------------------------------------------------------
    def _facts(self, rec: EventRecord) -> Dict[str, Any]:
        last = rec.approvals[-1] if rec.approvals else None
        return {
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
        }

    def _status_alert(self, rec: EventRecord) -> None:
        # queued now, built at delivery time so it carries the decision taken in this same call
        self._alert(
            Alert(
                f"{rec.event_id}:{rec.status}",
                "event-status",
                "",
                "",
                "",
                self._now,
                rec.event_id,
                rec.status,
            )
        )

    def _alert(self, alert: Alert) -> None:
        if alert.key in self._alerted or any(a.key == alert.key for a in self._alerts):
            return
        self._alerts.append(alert)

    def _deliver(self, alert: Alert) -> None:
        if alert.kind == "event-status" and alert.rounds == 0 and alert.event_id in self.events:
            rec = self.events[alert.event_id]
            alert.severity = (
                "info"
                if rec.status in ("Completed", "Cancelled")
                else (rec.decision.get("severity") or "warning")
            )
            alert.title = f"{rec.event_type} {rec.status}: {', '.join(rec.resources[:5])}" + (
                f" (+{len(rec.resources) - 5})" if len(rec.resources) > 5 else ""
            )
            nb = f", NotBefore {iso(rec.not_before)}" if rec.not_before and rec.status == "Scheduled" else ""
            alert.text = (
                f"Event {rec.event_id} ({rec.event_source}) is {rec.status}{nb}. "
                f"Decision: {rec.decision.get('action', 'none')} - {rec.decision.get('reason', '')}"
            )
            alert.facts = self._facts(rec)
        self._alerted.add(alert.key)
        alert.rounds += 1
        delivery: Delivery = self.alerter.send(alert)
        if not delivery.sent and self.settings.webhook_url and alert.rounds < ALERT_ROUNDS:
            self._unsent.append(alert)
        if delivery.sent:
            self._result.alerts_sent += 1
            self.counters["alertsSent"] += 1
        else:
            self._result.alerts_failed += 1
            self.counters["alertsFailed"] += 1
        self.store.stage("Alerts", rows.alert_entity(alert, delivery, self.alerter.fmt))

    def _forget_old(self) -> None:
        cutoff = self._now - ENDED_KEEP
        for event_id in [k for k, r in self.events.items() if r.ended and r.ended_at and r.ended_at < cutoff]:
            del self.events[event_id]


__all__ = ["BatchResult", "CentralService", "Decision", "InvalidRequest", "UnknownEvent"]
