"""CentralService: the one object function_app.py uses (Event Hubs batch, timer, HTTP).

It only wires the one-way steps together; each lives in its own module:
  ingest (envelopes -> State changes) -> evaluator (pure `decide` per event, committed) ->
  act (approval sends, alert deliveries) ; views (operator reads) ; logs flushed at the end.
The State table is the only truth (central.store.fleet_state): any number of instances may run these calls at
once; in-memory state is a cache validated by ETags at every commit. The lock only keeps this
instance's cache consistent when the Functions worker runs the timer and the trigger on two threads.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from datetime import datetime, timedelta
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from cachetools import TTLCache

from central.intake.authz import NAME_RELEASE
from central.intake.plan import heartbeat_log_every
from central.intake.sender import SenderAuth
from central.model import times
from central.model.alert import ALERT_LEASE, Alert
from central.model.times import aware
from central.policy import document as policy_mod
from central.policy.decide import DecideConfig
from central.policy.group_tags import Grouping
from central.policy.witness import WitnessRules
from central.policy.witness import scopes as witness_scopes
from central.store.fleet_state import Changes, FleetState
from central.store.server_clock import ServerClock
from central.store.tables import Conflict, StoreError, TableLog
from central.telemetry import metrics

from . import views
from .act import CLAIM_SEND_GRACE, Actor
from .approval_queue import ApprovalSender
from .arm_approvals import ArmApprover, arm_approver
from .coverage_read import CoverageReader, coverage_reader
from .coverage_read import section as coverage_section
from .evaluator import Evaluator
from .ingest import Gate, Ingest, Item, accept_all, bad_from, parse
from .operator_desk import OperatorDesk
from .platform_ingest import PlatformIngest, unconfirmed_alerts
from .results import BatchResult, Decision, InvalidRequest, UnknownEvent, new_counters
from .reverify import Reverifier
from .settings import CentralSettings, CountingTransport, SettingsError, storage_clients
from .webhook import WebhookAlerter

log = logging.getLogger("central.service")  # stable: docs and queries select on it

# Envelope ids remembered for exact-duplicate drops: the host's redelivery from its last checkpoint and a
# forwarder's re-send after an unanswered send (its back-off caps at 30 s) come within minutes. A cache:
# a replay older than that is stale anyway (central.intake.plan). Bounded in time, so at steady load the
# memory is flat after SEEN_SECONDS (bench.central_soak), and in count, for a fleet too large for the window.
SEEN_LIMIT = 200_000
SEEN_SECONDS = 900.0


class CentralService:
    def __init__(
        self,
        settings: CentralSettings,
        store: TableLog,
        sender: ApprovalSender,
        alerter: WebhookAlerter,
        transport: Optional[CountingTransport] = None,
        sender_auth: Optional[SenderAuth] = None,
        arm: Optional[ArmApprover] = None,
        coverage: Optional[CoverageReader] = None,
        clock: Optional[ServerClock] = None,
    ) -> None:
        self.settings = settings
        self.clock = clock  # Storage's clock, installed as central's (central.model.times) by from_settings
        self.store = store
        self.transport = transport
        self.sender_auth = sender_auth or SenderAuth(None)
        self.coverage = coverage  # None: COVERAGE_SCOPES empty
        self.gate: Gate = self.sender_auth.check if self.sender_auth.enabled else accept_all
        try:
            self.policy = policy_mod.load(settings.policy_json)
            self.policy_error: Optional[policy_mod.PolicyError] = None
        except policy_mod.PolicyError as exc:
            log.error("%s; holding every event until it is fixed", exc)
            self.policy = policy_mod.fallback(exc)
            self.policy_error = exc
        self.shadow_error, shadow = "", None
        if settings.shadow_json.strip():
            try:
                shadow = policy_mod.load(settings.shadow_json)
            except policy_mod.PolicyError as exc:
                log.error("POLICY_SHADOW_JSON is ignored: %s", exc)
                self.shadow_error = str(exc)
        self.config = DecideConfig(
            result_timeout=timedelta(seconds=settings.result_timeout),
            hook_result_timeout=timedelta(seconds=settings.hook_result_timeout),
            liveness=timedelta(seconds=settings.liveness),
            policy_error=str(self.policy_error or ""),
            witness=WitnessRules(timedelta(seconds=settings.report_grace), settings.claims_per_hour,
                                 witness_scopes(settings.confirm_scopes),
                                 timedelta(seconds=settings.confirm_grace)),
        )
        self.state = FleetState(store)
        # the head's log tags each change with its budget groups (central.policy.group_tags)
        budgets = [*self.policy.budgets.values(), *(shadow.budgets.values() if shadow is not None else ())]
        self.state.grouping, self.state.name_release = Grouping.of(budgets), NAME_RELEASE
        self.ingest = Ingest(self.state, store, heartbeat_log_every(settings.heartbeat_missing_minutes))
        self.platform = PlatformIngest(self.state, self.ingest)
        self.evaluator = Evaluator(self.state, store, self.policy, self.config)
        self.evaluator.shadow = shadow
        self.ingest.decider = self.evaluator  # decide inside the ingest commit (central.runtime.inline)
        self.actor = Actor(self.state, store, sender, alerter, arm)
        floor = settings.status_alert_floor  # STATUS_ALERT_MIN_SEVERITY: when owed, decided and delivered
        self.ingest.alert_floor = self.evaluator.alert_floor = self.actor.alert_floor = floor
        self.counters = new_counters()
        self._seen: TTLCache = TTLCache(maxsize=SEEN_LIMIT, ttl=SEEN_SECONDS)
        self._lock = threading.RLock()
        self._policy_alerted = False
        # envelopes kept for a trust failure, re-verified once trust is repaired (central.runtime.reverify)
        self.reverifier = Reverifier(store, lambda body, at, props: parse(body, at, self._recheck, props),
                                     lambda items, at, result: self.ingest.apply(items, at, result),
                                     settings.authn_held_days)
        self.desk = OperatorDesk(self.state, store, self.evaluator, self.actor, self.config, self._lock,
                                 self._flush)

    @classmethod
    def from_settings(cls, settings: Mapping[str, str], count_requests: bool = False) -> CentralService:
        """Build from app settings (os.environ in Azure; see central/app_settings.json). Raises
        SettingsError (one actionable line) on a setting that cannot work."""
        typed = CentralSettings.from_mapping(settings)
        try:
            sender_auth = SenderAuth.from_settings(typed.authn_trust_pem, typed.authn_metadata_domains,
                                                   typed.authn_mode, typed.authn_aia_hosts)
        except ValueError as exc:  # authn.TrustConfigError
            raise SettingsError(f"sender authentication (AUTHN_*): {exc}") from None
        transport = CountingTransport() if count_requests else None
        clock = ServerClock()  # this host's clock until Storage's Date headers disagree with it
        times.use_clock(clock.now)  # central's "now" everywhere it is not given one (one service per worker)
        tables, queues = storage_clients(settings, transport=transport, clock=clock)
        alerter = WebhookAlerter(
            url=typed.webhook_url,
            fmt=typed.webhook_format,
            public_url=typed.public_url,
            max_attempts=typed.alert_attempts,
            backoff=typed.alert_backoff,
            timeout=typed.alert_timeout,
        )
        store = TableLog(tables, typed.table_prefix)
        return cls(typed, store, ApprovalSender(queues), alerter, transport, sender_auth,
                   arm_approver(typed, settings), coverage_reader(typed, settings), clock)

    @property
    def sender(self) -> ApprovalSender:
        return self.actor.sender

    @sender.setter
    def sender(self, value: ApprovalSender) -> None:
        self.actor.sender = value

    @property
    def alerter(self) -> WebhookAlerter:
        return self.actor.alerter

    def _recheck(self, vm_id: str, body: Union[bytes, str], properties: Optional[Mapping[Any, Any]],
                 received: datetime, subscriptions: Sequence[str] = ()) -> str:
        """The sender gate for a kept envelope's re-verification (not counted as live traffic)."""
        return self.sender_auth.check(vm_id, body, properties, received, subscriptions, count=False)

    # ---- the public operations -------------------------------------------------------------------
    def handle_batch(
        self,
        bodies: Sequence[Union[bytes, str]],
        now: Optional[datetime] = None,
        enqueued_times: Optional[Sequence[Optional[datetime]]] = None,
        properties: Optional[Sequence[Optional[Mapping[Any, Any]]]] = None,
    ) -> BatchResult:
        """Process one Event Hubs batch. Bad envelopes are quarantined; the rest go on. `enqueued_times`:
        when the hub took each body (central's clock for liveness and ordering; default: now).
        `properties`: each event's application properties (the sender's authentication).
        Raises StoreError only when Table storage cannot be written (the batch may be retried whole)."""
        with self._lock:
            now = aware(now)
            result = BatchResult(received=len(bodies))
            items: List[Item] = []
            keys: List[str] = []  # remembered only once the batch is committed: a retried batch is whole
            batch_keys: set = set()
            for i, body in enumerate(bodies):
                received = _received(enqueued_times, i, now)
                try:
                    props = properties[i] if properties is not None and i < len(properties) else None
                    item = parse(body, received, self.gate, props)
                except Exception as exc:  # noqa: BLE001 - input never raises into the host: quarantine it
                    item = Item(
                        bad_from(body, [{"path": "/", "message": f"unusable: {exc}"[:300]}]), received
                    )
                env = item.parsed
                # an unsigned envelope is never taken for a duplicate (nor remembered as one): one
                # refused as a downgrade must not make the VM's signed envelope of that id look seen
                if hasattr(env, "type") and item.signed is not False:
                    key = f"{env.vm_id}|{env.id}"  # type: ignore[union-attr]
                    if key in self._seen or key in batch_keys:
                        result.duplicates += 1
                        continue
                    batch_keys.add(key)
                    keys.append(key)
                items.append(item)
            self.evaluator.intake_lag.note(now, (item.received for item in items))
            done = self._run(now, result, lambda: self.ingest.apply(items, now, result))
            for key in keys:
                self._remember(key)
            return done

    def handle_platform_batch(self, bodies: Sequence[Union[bytes, str]], now: Optional[datetime] = None,
                              enqueued_times: Optional[Sequence[Optional[datetime]]] = None) -> BatchResult:
        """Process one batch from the platform hub (Event Grid's ScheduledEventEmitted events, issue 23):
        the platform's witness, recorded on the same event records. Never raises for bad input."""
        with self._lock:
            now = aware(now)
            result = BatchResult(received=len(bodies))
            received = [_received(enqueued_times, i, now) for i in range(len(bodies))]
            return self._run(now, result, lambda: self.platform.apply(bodies, received, now, result))

    def decide(self, event_id: str, action: str, operator: str, reason: str, now: Optional[datetime] = None,
               hook: bool = False, via: str = "queue") -> Dict[str, Any]:
        """An operator's approve, hold or release (central.runtime.operator_desk), binding on every instance
        once this returns. `via` "arm": approve through ARM rather than a VM's forwarder."""
        return self.desk.decide(event_id, action, operator, reason, now, hook, via)

    def reevaluate(self, now: Optional[datetime] = None) -> List[Decision]:
        """Timer: windows opening, budgets freeing, silent leaders (failover), NotBefore passing, approvals
        committed but never sent, alerts owed and due. Linear in active events."""
        with self._lock:
            now = aware(now)
            result = BatchResult()

            def before() -> None:
                self.state.refresh()
                self.actor.resend_stale(now, result)
                for alert in unconfirmed_alerts(self.state, self.config.witness, now, self.ingest.raised):
                    self.ingest.remember_raised(alert.key)
                    self._raise_row(alert, result)
                if self.sender_auth.enabled and self.reverifier.due(now):
                    self.reverifier.run(now, result)  # the timer decides every active event anyway
                given_up = self.reverifier.give_up(now) if self.sender_auth.enabled else None
                if given_up is not None:  # past AUTHN_HELD_DAYS: marked, counted, and said once
                    self._raise_row(given_up, result)

            self._run(now, result, lambda: (before(), None)[1], timer=True)
            return result.decisions

    def reverify(self, now: Optional[datetime] = None) -> Dict[str, Any]:
        """The operator's trigger: re-verify the envelopes kept for a trust failure now, with this
        instance's trust, and apply those that verify (as of when they were received)."""
        if not self.sender_auth.enabled:
            raise InvalidRequest("sender authentication is off (AUTHN_MODE=off): nothing is re-verified")
        with self._lock:
            now = aware(now)
            result = BatchResult()
            self._run(now, result, lambda: self.reverifier.run(now, result))
            return {"at": now.isoformat(), "outcomes": dict(self.reverifier.last),
                    "decisions": len(result.decisions), "heldForTrust": self.held_for_trust(now)}

    def held_for_trust(self, now: Optional[datetime] = None) -> Dict[str, Any]:
        """Envelopes kept for a trust failure, not yet re-verified: count, oldest, issuers."""
        if not self.sender_auth.enabled:
            return {"count": 0, "oldest": None, "issuers": []}
        try:
            return self.reverifier.summary(aware(now))
        except StoreError as exc:
            return {"error": str(exc)[:300]}

    def pending(self) -> List[Dict[str, Any]]:
        with self._lock:
            return views.pending(self.state)

    def event(self, event_id: str, now: Optional[datetime] = None) -> Dict[str, Any]:
        with self._lock:
            return views.event(self.state, event_id, aware(now))

    def fleet(self, now: Optional[datetime] = None) -> Dict[str, Any]:
        with self._lock:
            out = views.fleet(self.state, self.policy, self.settings, aware(now))
            out["heldForTrust"] = self.held_for_trust(now)
        # Resource Graph (cached) outside the lock: a slow read never holds up ingest
        out["coverage"] = coverage_section(self.coverage, out, aware(now))
        return out

    def health(self, now: Optional[datetime] = None) -> Dict[str, Any]:
        with self._lock:
            now = aware(now)
            return views.health(
                self.state, self.policy, self.policy_error is None, self.settings, now, self.counters,
                self.store.staged_count, self.transport.requests if self.transport else None,
                {**self.sender_auth.status(now), "heldForTrust": self.held_for_trust(now)},
                self._shadow_status())

    def _shadow_status(self) -> Optional[Dict[str, Any]]:
        if self.evaluator.shadow is not None:
            return self.evaluator.shadow.describe()
        if self.shadow_error:
            return {"source": "POLICY_SHADOW_JSON", "valid": False, "errors": [self.shadow_error[:1000]]}
        return None

    # ---- one call --------------------------------------------------------------------------------
    def _run(self, now: datetime, result: BatchResult, first: Any, timer: bool = False) -> BatchResult:
        self.ingest.owed, self.ingest.rows_owed, self.evaluator.owed = set(), [], set()
        self.actor.owed = set()
        self.ingest.sends = []
        lost = self.actor.lost_races
        try:
            touched = first()  # what is left to decide: the events its commits did not decide already
            self._policy_alert(now, result)
            sends = self.ingest.sends
            sends += self.evaluator.run(None if timer else touched, now, result) if (timer or touched) else []
            extra = [(a, self.state.alert_etags.pop(a.key, None)) for a in self.ingest.rows_owed]
            self.actor.act(sends, self.ingest.owed | self.evaluator.owed, now, result, extra)
            if timer:
                self.actor.deliver(now, result, None, extra=self.actor.due_rows(now))
        except StoreError as exc:
            result.conflicts += self.actor.lost_races - lost
            self._store_failed(exc, "commit", result)
            raise
        result.conflicts += self.actor.lost_races - lost  # acting's lost races count too
        self._flush(result)
        return result

    def _store_failed(self, exc: StoreError, operation: str, result: BatchResult) -> None:
        """Count and report a store failure before the call re-raises it (the host retries the batch)."""
        self.counters["storeErrors"] += 1
        metrics.store_error(operation)
        result.errors.append(str(exc)[:500])
        self._count(result)

    def _flush(self, result: BatchResult) -> None:
        try:
            result.transactions += self.store.flush()
        except StoreError as exc:
            self._store_failed(exc, "flush", result)
            raise
        for problem in self.store.take_rejected():
            at = aware(None)
            self.counters["rowsSetAside"] += 1
            metrics.store_error("row-set-aside")
            result.errors.append(problem)
            self._raise_row(
                Alert(
                    f"row-set-aside:{hashlib.sha256(problem.encode()).hexdigest()[:24]}",
                    "row-set-aside",
                    "warning",
                    "Central set aside a log row the store refuses",
                    problem,
                    at,
                    next_try=at + ALERT_LEASE,
                ),
                result,
            )
        self._count(result)

    def _count(self, result: BatchResult) -> None:
        c = self.counters
        c["envelopes"] += result.processed
        c["duplicates"] += result.duplicates
        c["stale"] += result.stale
        c["quarantined"] += result.quarantined
        c["late"] += result.late
        c["refused"] += result.refused
        c["downgrades"] += result.downgrades
        self.sender_auth.downgraded(result.downgrades)
        c["approvals"] += result.approvals_sent
        c["alertsSent"] += result.alerts_sent
        c["alertsLogged"] += result.alerts_logged
        c["alertsFailed"] += result.alerts_failed
        c["conflicts"] += result.conflicts

    def _policy_alert(self, now: datetime, result: BatchResult) -> None:
        if self.policy_error is None or self._policy_alerted:
            return
        self._policy_alerted = True
        digest = hashlib.sha256(str(self.policy_error.errors).encode()).hexdigest()[:16]
        self._raise_row(
            Alert(
                f"policy-invalid:{digest}",
                "policy-invalid",
                "critical",
                "Central policy is invalid: every event is held",
                str(self.policy_error),
                now,
                facts={"errors": self.policy_error.errors[:5]},
                next_try=now + ALERT_LEASE,
            ),
            result,
        )

    def _raise_row(self, alert: Alert, result: BatchResult) -> None:
        """An alert owed by no event: kept in the State table, then delivered (at least once)."""
        try:
            self.state.commit(Changes(alerts=[alert]), alert.at)
        except (Conflict, StoreError) as exc:
            log.error("alert %s not recorded: %s", alert.key, exc)
            return
        self.actor.deliver(
            alert.at, result, mine=[], extra=[(alert, self.state.alert_etags.pop(alert.key, None))]
        )

    def _remember(self, key: str) -> None:
        self._seen[key] = None  # the oldest goes when full (cachetools)


def _received(enqueued: Optional[Sequence[Optional[datetime]]], i: int, now: datetime) -> datetime:
    """Central's clock for one body: the hub's enqueued time, never later than now."""
    if enqueued is None or i >= len(enqueued) or enqueued[i] is None:
        return now
    return min(aware(enqueued[i]), now)


__all__ = ["CLAIM_SEND_GRACE", "BatchResult", "CentralService", "Decision", "InvalidRequest", "UnknownEvent"]
