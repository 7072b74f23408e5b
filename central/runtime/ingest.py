"""Ingest: envelopes -> state changes in the store (the State table), plus their log rows.

One-way: parse and check every body (schema, store limits, the sender gate), then plan the changes
on copies of the cached rows and commit them under the store's concurrency control. Planning is
redone from re-read rows whenever a commit loses a race, so the cache can never make a change wrong.
Envelopes are committed in segments of at most ~95 operations (one transaction each, all or nothing);
an envelope whose rows the store refuses is set aside and quarantined, never retried forever.

Liveness and ordering use central's clock: the time the hub enqueued the envelope (or, without one,
when central received it), never the VM's own `time`.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Sequence, Set, TypeVar, Union

from cachetools import FIFOCache

from central.intake import bounds as limits
from central.intake import parse as env_mod
from central.intake.plan import HEARTBEAT_LOG_EVERY, UNBOUND, Item, Plan, Planner, bad_from
from central.intake.sender import claimed_subscriptions
from central.model.alert import ALERT_LEASE, Alert
from central.model.envelope import APPROVAL_RESULT, HEARTBEAT, INCARNATION, QUARANTINED, BadEnvelope, Envelope
from central.policy.fleet_view import seen_by_others
from central.policy.group_tags import RecentGroups, StaleGroups
from central.store.fleet_state import Changes, FleetState
from central.store.tables import Conflict, Rejected, StoreError, TableLog
from central.telemetry import metrics

from .alert_rules import DEFAULT_FLOOR, drop_quiet
from .results import BatchResult

if TYPE_CHECKING:
    from .evaluator import Evaluator, ToSend

log = logging.getLogger("central.ingest")  # stable: docs and queries select on it

SEGMENT_OPS = 100  # operations per State transaction (the service's limit)
MAX_TRIES = 8  # plans per segment before a lost race counts as a (transient) store error
RAISED_LIMIT = 10_000
# Planning re-reads, with another instance's changed events, their VMs' rows last seen longer ago than one
# heartbeat (the forwarder's 60 s): fresher by then, they stay reusable for a budget count (vm_facts).
RIDER_SEEN_WITHIN = timedelta(seconds=60)

# The sender check (central.intake.sender.SenderAuth.check): called with each schema-valid envelope's claimed
# vmId, its raw body, its Event Hubs application properties, central's receive time and the subscriptions
# the envelope claims (`claimed_subscriptions`) before anything is applied; returns "" to accept or the
# reason to quarantine it.
Gate = Callable[[str, Union[bytes, str], Optional[Mapping[Any, Any]], datetime, Sequence[str]], str]


def accept_all(vm_id: str, body: Union[bytes, str], properties: Optional[Mapping[Any, Any]],
               received: datetime, subscriptions: Sequence[str] = ()) -> str:
    return ""


def parse(
    body: Union[bytes, str], received: datetime, gate: Gate, properties: Optional[Mapping[Any, Any]] = None
) -> Item:
    """A body -> Envelope, or BadEnvelope (schema, store limits, or the sender check refused it)."""
    item = env_mod.parse_body(body)
    signed = None
    if isinstance(item, Envelope):
        problems = limits.envelope_problems(item.type, item.data)
        problems += [
            {"path": "/", "message": m} for m in (limits.text_problem(env_mod._text(body), item.raw),) if m
        ]
        # The sender check runs on an over-limit envelope too: whether its vmId is verified decides
        # what its alert may be keyed by (a forged claim must never key the named VM's alerts).
        reason = gate(item.vm_id, body, properties, received, claimed_subscriptions(item))
        signed = getattr(reason, "signed", None)  # central.intake.sender.Admitted
        if reason:
            problems.append({"path": "/", "message": f"refused by the sender check: {reason}"[:300]})
        if problems:
            bad = bad_from(body, problems, item, verified=not reason)
            if getattr(reason, "kind", "") == "trust":
                # kept with what re-verifying it needs once trust is repaired (docs/security.md runbook)
                bad.extra.update(trustIssuer=getattr(reason, "issuer", ""), receivedAt=received,
                                 authProperties=auth_properties(properties))
            item = bad
    return Item(item, received, signed if isinstance(item, Envelope) else None)


def auth_properties(properties: Optional[Mapping[Any, Any]]) -> dict:
    """The sender-authentication application properties of an event, as text (bounded by the verifier's
    own limits: a document over 16 KiB was refused as malformed, not as a trust failure)."""
    from schemas import authn as wire

    out = {}
    for k, v in (properties or {}).items():
        key = k.decode("utf-8", "replace") if isinstance(k, (bytes, bytearray)) else str(k)
        if key in wire.PROPERTIES:
            out[key] = (v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v))[:20000]
    return out


S = TypeVar("S")


def one_at_a_time_if_refused(segment: List[S], commit: Callable[[], Set[str]],
                             commit_part: Callable[[List[S]], Set[str]],
                             set_aside: Callable[[S, str], Set[str]]) -> Set[str]:
    """`commit()` the segment; when the store refuses a row (Rejected), commit its items one at a time
    (`commit_part`) to find the one it refuses, and `set_aside` that one (quarantined, with why): a batch the
    host retried whole would be refused again, without end (host.json retries forever)."""
    try:
        return commit()
    except Rejected as exc:
        if len(segment) == 1:
            return set_aside(segment[0], str(exc))
        touched: Set[str] = set()
        for item in segment:
            touched |= commit_part([item])
        return touched


class Ingest:
    def __init__(self, state: FleetState, logs: TableLog,
                 heartbeat_log_every: float = HEARTBEAT_LOG_EVERY) -> None:
        self.state = state
        self.logs = logs
        # alert keys of envelope-level alerts raised lately: a replayed bad body is not alerted again
        # (a cache: suppressing a repeat of an alert already owed or delivered loses nothing)
        self.raised: FIFOCache = FIFOCache(maxsize=RAISED_LIMIT)
        self.owed: Set[str] = set()  # event alert keys committed by this call (delivered at once)
        self.rows_owed: List[Alert] = []  # alerts owed by no event committed by this call
        self.planner = Planner(state, self.raised, heartbeat_log_every)
        # decides the events a plan touched inside its commit (the service's Evaluator; None: after it)
        self.decider: Optional[Evaluator] = None
        self.sends: List[ToSend] = []  # approval attempts committed by this call, to send
        self.alert_floor = DEFAULT_FLOOR  # STATUS_ALERT_MIN_SEVERITY: status alerts under it are not owed
        self.recent_groups = RecentGroups()  # the budget groups this instance decided in lately

    # ---- segments and the commit loop ---------------------------------------------------------
    def apply(self, items: List[Item], now: datetime, result: BatchResult) -> Set[str]:
        """Commit every item; returns the events to decide about. Raises StoreError only for storage
        failures (nothing of the failed segment was written: the batch can be retried whole)."""
        touched: Set[str] = set()
        segment: List[Item] = []
        vms: Set[str] = set()
        ops = 0
        for item in items:
            cost = self._cost(item, set(vms))
            if segment and ops + cost > SEGMENT_OPS:
                touched |= self._commit_segment(segment, now, result)
                segment, ops, vms = [], 0, set()
                cost = self._cost(item, set())
            segment.append(item)
            if isinstance(item.parsed, Envelope):
                vms.add(item.parsed.vm_id)
            ops += cost
        if segment:
            touched |= self._commit_segment(segment, now, result)
        return touched

    def _cost(self, item: Item, vms: Set[str]) -> int:
        """An upper bound of the operations `item` adds to a segment whose VMs are `vms` (the head
        counted once per envelope that may change events)."""
        env = item.parsed
        if isinstance(env, BadEnvelope):
            return 1  # its alert row
        if item.signed is False:  # may be refused as a downgrade instead: two alert rows
            return 2 + self._cost(Item(env, item.received), vms)
        row = 0 if env.vm_id in vms else 1
        vms.add(env.vm_id)
        vm = self.state.vm(env.vm_id)
        if env.type == HEARTBEAT:  # (and its outbox-drop alert, when the counter went up)
            dropped = (env.data.get("outbox") or {}).get("dropped", 0)
            return row + (1 if vm is None or dropped > vm.outbox_dropped else 0)
        if env.type == QUARANTINED:
            return row + 1
        if env.type == APPROVAL_RESULT:
            return row + 3  # the event (may move o: -> x:) and the head
        listed = len(vm.listed) if vm else 0
        events = len((env.data.get("document") or {}).get("Events") or [])
        return row + (2 * (events + listed) + 1 if events + listed else 0)

    def _commit_segment(self, segment: List[Item], now: datetime, result: BatchResult) -> Set[str]:
        def plan_once() -> Plan:
            self._prepare(segment, now)
            return self.planner.plan(segment, now)

        return one_at_a_time_if_refused(
            segment, lambda: self.commit_planned(plan_once, now, result, "ingest"),
            lambda part: self._commit_segment(part, now, result),
            lambda item, why: self._set_aside(item, why, now, result))

    def remember_raised(self, key: str) -> None:
        """An alert key this instance has raised (a cache of recent keys: the store keeps the truth)."""
        self.raised[key] = None  # the oldest goes when full (cachetools)

    def commit_planned(self, plan_once: Callable[[], Plan], now: datetime, result: BatchResult,
                       what: str) -> Set[str]:
        """Plan on the cached rows and commit the plan; a commit that lost a race has re-read the rows, so
        plan again on them. Every input kind (envelopes, the platform's events) commits through here, so
        the after-commit steps (owed alerts, log rows, markers, metrics) are one. Rejected propagates."""
        decider = self.decider
        tries = stale = 0
        while tries < MAX_TRIES:
            tries += 1
            plan = plan_once()
            # the touched events decided in this very transaction (central.runtime.inline): one head commit
            try:
                done = None if decider is None else decider.decide_planned(plan.changes, plan.touched, now)
            except StaleGroups as exc:  # a group whose changes the catch-up deferred: read them, plan again
                tries, stale = tries - 1, stale + 1  # (not a lost race; each retry reads what it lacked)
                if stale > MAX_TRIES:
                    raise StoreError(f"{what}: budget groups still stale after {MAX_TRIES} reads") from exc
                self.recent_groups.widen(exc.tags, now)  # and its next catch-ups read those groups first
                self.state.read_deferred(exc.tags)
                result.stale_groups += 1
                continue
            for rec in plan.changes.events.values():  # (decided now: the rule's severity is known)
                drop_quiet(rec, self.alert_floor)
            # (and by the decisions' pass on the copies that replace the plan's)
            plan.owed &= {a["key"] for rec in plan.changes.events.values() for a in rec.pending_alerts}
            try:
                seq = self.state.commit(plan.changes, now, unseen=self._unseen_by_others(plan))
            except Conflict as exc:
                result.conflicts += 1
                log.info("%s lost a race (%s): planning again on the re-read rows", what, exc)
                continue
            except Rejected:
                if done is None:
                    raise
                # the store refuses the rows with the decisions in them: commit the plan alone (its own
                # envelope may be at fault, found by the caller), deciding after it as before
                log.warning("%s: the store refused the rows with their decisions; deciding after the commit",
                            what)
                decider = None
                continue
            result.transactions += 0 if plan.changes.empty() else 1
            self._after(plan, seq, now, result)
            if done is None:
                return plan.touched
            self.sends += decider.committed(done, now, result)  # type: ignore[union-attr]
            return (plan.touched - done.decided) | done.later
        raise StoreError(f"{what}: still losing races after {MAX_TRIES} re-reads (contention)")

    def _set_aside(self, item: Item, why: str, now: datetime, result: BatchResult) -> Set[str]:
        """The store refuses this envelope's rows: quarantine it (kept whole, alerted) and go on."""
        if isinstance(item.parsed, BadEnvelope):  # its quarantine refused too: nothing lower to keep it in
            return self.unstorable(item.parsed, why, now, result)
        body = item.parsed.raw if isinstance(item.parsed, Envelope) else None
        text = json.dumps(body) if body is not None else getattr(item.parsed, "text", "")
        bad = bad_from(
            text,
            [{"path": "/", "message": f"the log store refused its rows: {why}"[:300]}],
            item.parsed if isinstance(item.parsed, Envelope) else None,
            # it passed the sender check before the store refused it; an unsigned one (preferred) is no
            # verified sender, so its alert names no VM (issue 22 point 7)
            verified=item.signed is not False,
        )
        log.error("envelope set aside: the store refuses its rows: %s", why)
        return self._commit_segment([Item(bad, item.received)], now, result)

    def unstorable(self, bad: BadEnvelope, why: str, now: datetime, result: BatchResult) -> Set[str]:
        """The store refused even the quarantine rows of something set aside. Dropped only once a critical
        alert row of fixed content (no text of the body: its hash) is committed: then the refusal is this
        body's; the log line adds its envelope (or Event Grid) id and claimed vmId. The body stays in Event
        Hubs for the hub's retention, and in Capture's archive when on. Retried, the batch would be refused
        without end and stall its partition. A store that refuses that row too refuses everything (a version
        it does not take, a broken request): Rejected propagates, the batch fails and is retried, nothing
        dropped."""
        what = "a platform event" if bad.extra.get("source") == "platform" else "an envelope"
        alert = Alert(f"unstorable:{bad.sha256[:40]}", "unstorable", "critical",
                      f"Central dropped {what} the log store refuses to keep, even as quarantined",
                      f"The store's answer: {why}"[:1000], now, next_try=now + ALERT_LEASE,
                      facts={"sha256": bad.sha256, "source": bad.extra.get("source") or "envelope"})
        self.state.commit(Changes(alerts=[alert]), now)
        self.rows_owed.append(alert)
        log.error("se.unstorable: dropped %s the store refuses even as quarantined (envelope or Event Grid "
                  "id %r, claimed vmId %r, sha256 %s): %s", what, (bad.envelope_id or "")[:256],
                  (bad.vm_id or "")[:64], bad.sha256, why)
        metrics.store_error("unstorable")
        result.errors.append(f"dropped {what} the store refuses even as quarantined: {why}"[:500])
        return set()

    def _unseen_by_others(self, plan: Plan) -> Set[str]:
        """The events the plan changes in nothing that deciding about another event reads
        (fleet_view.seen_by_others: a result, Started, a new incarnation listing them again): the commit
        leaves them out of the head's log (a commit of only those does not move the head), so other
        instances neither re-read those rows nor lose a race to it (a commit of theirs on one of them fails
        on its ETag and re-reads it)."""
        active = self.state.active
        return {event_id for event_id, rec in plan.changes.events.items()
                if event_id in active and seen_by_others(active[event_id][0]) == seen_by_others(rec)}

    def _prepare(self, segment: List[Item], now: datetime) -> None:
        """Read what planning needs and the cache lacks (unknown VMs and their names; the events changed since
        the cached head when any may change, and the ended rows of the reported ones), most in one query."""
        envs = [i.parsed for i in segment if isinstance(i.parsed, Envelope)]
        # the events the documents list (EventId -> the VM names it names), and those a result answers or a VM
        # listed before (ended when not listed now): their rows
        listed = {str(event.get("EventId")): [str(n) for n in event.get("Resources") or [] if n]
                  for e in envs if e.type == INCARNATION
                  for event in (e.data.get("document") or {}).get("Events") or [] if isinstance(event, dict)}
        reported = [*listed, *(str(e.data.get("eventId")) for e in envs if e.type == APPROVAL_RESULT),
                    *(event_id for e in envs if e.type == INCARNATION
                      for event_id in (self.state.vm(e.vm_id) or UNBOUND).listed)]
        # what changed since the cached head: a plan on stale rows loses its race
        may_change = any(e.type in (INCARNATION, APPROVAL_RESULT) for e in envs)
        wanted = None
        if may_change:  # the budget groups its decisions will likely count (central.policy.group_tags)
            wanted = self.recent_groups.widen(
                self.state.wanted_tags({e.vm_id: e.data.get("vm") or {} for e in envs}, listed), now)
        self.state.read_for_plan({e.vm_id: e.vm_name for e in envs}, reported, may_change,
                                 seen_after=now - RIDER_SEEN_WITHIN, wanted=wanted)
        unbound = [e.vm_name for e in envs if not (self.state.vm(e.vm_id) or UNBOUND).name_bound]
        if unbound:  # a VM seen for the first time (or one that lost its name): the holder of its name
            holders = [self.state.bound_vm(n) for n in unbound]
            self.state.load_vms([h for h in holders if h and self.state.vm(h) is None])

    def _after(self, plan: Plan, seq: int, now: datetime, result: BatchResult) -> None:
        self.owed |= plan.owed
        self.rows_owed += plan.changes.alerts
        for alert in plan.changes.alerts:
            self.remember_raised(alert.key)
        for table, entity in plan.log_rows:
            self.logs.stage(table, entity)
        many_per_line = (metrics.HEARTBEAT_MARKER, metrics.QUARANTINE_MARKER)
        for level, fmt, args in plan.markers:
            if fmt not in many_per_line:
                log.log(level, fmt, *args)
        # many VMs per line (one billed record)
        for line in metrics.heartbeat_lines([a for _, f, a in plan.markers if f == metrics.HEARTBEAT_MARKER]):
            log.info("%s", line)
        metrics.log_quarantines([a for _, f, a in plan.markers if f == metrics.QUARANTINE_MARKER])
        for record in plan.metrics:  # recorded once the commit made them true (a replan never counts twice)
            record()
        for name, n in plan.counts.items():
            setattr(result, name, getattr(result, name) + n)

    # ---- planning (on copies; nothing is written here) ------------------------------------------
