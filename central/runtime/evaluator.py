"""Deciding, committed: run the pure `decide` over events and commit what it says under the store's
concurrency control. A pass reads the head-validated fleet state, decides each event in order of
first sight (later events see earlier approvals in the budget counts), and commits every new decision
with the head's If-Match: if any event changed meanwhile the whole pass is re-read and decided again,
so two instances racing on one event end with exactly one outcome. Approval attempts are committed
(unsent) before anything is sent: the commit is what makes attempt N this instance's to send.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Dict, Iterable, List, Optional, Set, Tuple

from central.intake.alerts import owe_status_alert
from central.model.alert import ALERT_LEASE, Alert
from central.model.clone import clone_event
from central.model.events import SEND_LEASE, Approval, EventRecord, in_order_of_first_sight
from central.model.vms import VmState
from central.policy.arm_route import arm_event_id
from central.policy.decide import (
    HAND_DECIDERS,
    DecideConfig,
    Verdict,
    decide,
    is_new,
    record,
    shadow_record,
)
from central.policy.document import Policy
from central.policy.fleet_view import FleetView
from central.policy.group_tags import StaleGroups
from central.store import log_rows as logrows
from central.store.fleet_state import EVENTS_PER_COMMIT, Changes, FleetState
from central.store.tables import MAX_OPS, Conflict, StoreError, TableLog
from central.telemetry import metrics

from .alert_rules import DEFAULT_FLOOR, drop_quiet
from .approval_queue import build_message, queue_name
from .arm_approvals import arm_attempt
from .inline import WaitingGroups, all_vms_over, candidates, freed_waiters, vms_by_name_over
from .intake_lag import IntakeLag
from .results import BatchResult, Decision
from .vm_facts import LazyVms, groups_hint, reading_fewer

log = logging.getLogger("central.evaluator")  # stable: docs and queries select on it

MAX_TRIES = 8


@dataclass
class ToSend:
    event_id: str
    attempt: int


@dataclass
class Pass:
    """One deciding pass, on working copies: the events it changed (with the decision taken, if any), the
    shadow policy's verdicts, the attempts to send once committed, the alert keys it made owed."""

    changed: List[Tuple[EventRecord, Optional[dict]]] = field(default_factory=list)
    shadows: Dict[str, dict] = field(default_factory=dict)
    sends: List[ToSend] = field(default_factory=list)
    owed: Set[str] = field(default_factory=set)
    decided: Set[str] = field(default_factory=set)  # every event the pass looked at
    later: Set[str] = field(default_factory=set)  # events it had no room for (decided after the commit)


class Evaluator:
    def __init__(self, state: FleetState, logs: TableLog, policy: Policy, config: DecideConfig) -> None:
        self.state = state
        self.logs = logs
        self.policy = policy
        self.base_config = config
        self.intake_lag = IntakeLag()  # noted by the service for each batch it reads
        self.owed: Set[str] = set()  # alert keys committed by this call (delivered at once)
        self.shadow: Optional[Policy] = None  # POLICY_SHADOW_JSON: decided beside, recorded, never sent
        self.waiting_groups = WaitingGroups()  # the waiting events' budget groups, between calls (inline)
        self.alert_floor = DEFAULT_FLOOR  # STATUS_ALERT_MIN_SEVERITY: status alerts under it are not owed

    @property
    def config(self) -> DecideConfig:
        """The decision settings, the leader liveness widened by how far behind the hub this instance reads
        (central.runtime.intake_lag): a forwarder heard from in a backlog is judged as of that backlog."""
        extra = self.intake_lag.allowance()
        if not extra:
            return self.base_config
        return replace(self.base_config, liveness=self.base_config.liveness + extra)

    def view(self, now: datetime, candidates: List[EventRecord],
             planned: Optional[Changes] = None, screening: bool = False) -> FleetView:
        """What deciding `candidates` may look at. `planned`: changes not committed yet (deciding inside
        the ingest commit, central.runtime.inline): their events and VMs stand over the committed ones.
        `screening`: the candidates' own VMs from the cache too, where reusable (see `run`)."""
        planned_events = planned.events if planned is not None else {}
        open_events = [rec for rec, _ in self.state.active.values()
                       if rec.event_id not in planned_events and not rec.ended]
        open_events += [rec for rec in planned_events.values() if not rec.ended]

        first = {name for rec in candidates for name in rec.resources}
        budgets = [*self.policy.budgets.values(), *(self.shadow.budgets.values() if self.shadow else ())]

        def then(vms: Mapping[str, VmState]) -> Set[str]:  # (called once the view below exists)
            """The VMs of the impacting events that may share a budget group with the candidates'."""
            mine = [vms[name] for name in first if name in vms]
            wanted: Set[str] = set()
            for budget in budgets:
                groups = {g for vm in mine for g in (budget.group_of(vm),) if g}
                for rec in view.impacting_in(budget, groups, now):
                    wanted.update(rec.resources)
            return wanted

        read, known = self.state.vms_by_name, self.state.all_vms
        if planned is not None and planned.vms:
            read, known = vms_by_name_over(self.state, planned.vms), all_vms_over(self.state, planned.vms)
        # the candidates' VMs fresh; other events' VMs from the cache when a read would not change a
        # budget count (central.runtime.vm_facts)
        fresh = set() if screening else first
        planned_vms = planned.vms if planned is not None else {}
        keep_out = {vm.name for vm in planned_vms.values()}
        read = reading_fewer(read, self.state.named, fresh, keep_out, now, self.config.liveness)
        hint = groups_hint(self.state.named, planned_vms, now, self.config.liveness)
        view = FleetView(LazyVms(first, then, read), open_events, self.config.liveness,
                         known if self.policy.needs_group_sizes else None, rules=self.config.witness,
                         groups_hint=hint, stale=self.state.stale_tags())
        return view

    def run(self, event_ids: Optional[Iterable[str]], now: datetime, result: BatchResult) -> List[ToSend]:
        """Decide the given events (None: every active event) and commit. Returns the attempts this
        instance now owns and must send."""
        wanted = None if event_ids is None else set(event_ids)
        if wanted is None:
            wanted = self._screen(now)
        for _ in range(MAX_TRIES):
            candidates = self._active(wanted)
            if not candidates:
                return []
            fleet = self.view(now, candidates)
            try:
                done = self.decide_pass(candidates, fleet, now)
            except StaleGroups:  # a group whose changes this cache deferred: read them, decide again
                self.state.read_deferred()  # (all of them: a conflict below is the only way back here)
                result.stale_groups += 1
                continue
            try:
                self._commit(done.changed, now)
            except Conflict as exc:
                result.conflicts += 1
                log.info("deciding lost a race (%s): deciding again on the re-read rows", exc)
                continue
            return self.committed(done, now, result)
        raise StoreError(f"deciding: still losing races after {MAX_TRIES} re-reads (contention)")

    def _active(self, wanted: Optional[Set[str]]) -> List[EventRecord]:
        """The active events not ended (only `wanted`, unless None), in order of first sight."""
        return in_order_of_first_sight(rec for rec, _ in self.state.active.values()
                                       if not rec.ended and (wanted is None or rec.event_id in wanted))

    def _screen(self, now: datetime) -> Set[str]:
        """The timer's pass over every active event, first on this instance's cached VM rows wherever a
        fresh read would give the same liveness and groups (central.runtime.vm_facts: at most the liveness
        window old): the events whose verdict that pass changes are then decided for real, on fresh rows.
        At 100k VMs a wave holds thousands of events waiting for a budget; reading all their VMs every
        minute made the timer's call the slowest of the wave (issue 24). An event whose verdict looks
        unchanged on cached rows is decided again once its rows age out of the cache, or when an ingest
        touches it."""
        self.state.read_deferred()  # (every group: what the timer's ingest of held envelopes deferred)
        candidates = self._active(None)
        if not candidates:
            return set()
        screened = self.decide_pass(candidates, self.view(now, candidates, screening=True), now)
        return {rec.event_id for rec, _ in screened.changed}

    def decide_planned(self, changes: Changes, touched: Set[str], now: datetime) -> Optional[Pass]:
        """Decide the events an uncommitted plan touched, on its working copies (central.runtime.inline):
        the decided copies replace the plan's, so one transaction commits both. None: nothing to decide."""
        found = candidates(changes, touched)
        budgets = list(self.policy.budgets.values())
        waiting = freed_waiters(self.state, changes, budgets, now, self.waiting_groups)
        room = max(0, (MAX_OPS - changes.op_count()) // 2)  # an event row may take two operations
        later = {rec.event_id for rec in waiting[room:]}  # no room in this transaction: decided after it
        found = in_order_of_first_sight(found + waiting[:room])
        if not found:
            return Pass(later=later) if later else None
        done = self.decide_pass(found, self.view(now, found, changes), now)
        for rec, _ in done.changed:
            changes.events[rec.event_id] = rec
        done.decided = {rec.event_id for rec in found}
        done.later = later
        return done

    def decide_pass(self, candidates: List[EventRecord], fleet: FleetView, now: datetime) -> Pass:
        """Decide `candidates` in order on working copies (nothing written): what to commit, then send."""
        shadow_fleet = (FleetView(fleet.vms_by_name, fleet.open_events, fleet.liveness, fleet.known,
                                  fleet.rules, fleet.groups_hint, fleet.stale)
                        if self.shadow is not None else None)  # same facts, its own budget counts
        done = Pass()
        for rec in candidates:
            mine = clone_event(rec)  # a deep copy, faster (central.model.clone)
            stale = mine.stale_reason(now)
            if stale:  # made up, or lost by IMDS: ended, alerted, never decided again
                done.changed.append((mine, end_stale(mine, stale, now, done.owed)))
                done.owed -= drop_quiet(mine, self.alert_floor)
                continue
            verdict = decide(mine, fleet, self.policy, now, self.config)
            shadow = self._shadow(mine, shadow_fleet, now) if shadow_fleet is not None else None
            decision = apply(mine, verdict, now, done.owed)
            done.owed -= drop_quiet(mine, self.alert_floor)
            if shadow is not None:
                done.shadows[mine.event_id] = shadow
            if decision is not None or verdict.timed_out or shadow is not None:
                done.changed.append((mine, decision))
            if verdict.kind == "send" and decision is not None:
                fleet.mark_impacting(mine, now)
                done.sends.append(ToSend(mine.event_id, len(mine.approvals)))
        return done

    def committed(self, done: Pass, now: datetime, result: BatchResult) -> List[ToSend]:
        """After the commit that made `done` true: its log rows, results and metrics; the sends it owns."""
        self.owed |= done.owed
        for rec, _ in done.changed:
            if rec.event_id in done.shadows:
                self.logs.stage("Decisions", logrows.shadow_entity(
                    rec.event_id, rec.event_type, rec.shadow_seq, done.shadows[rec.event_id], now))
        for rec, decision in done.changed:
            if decision is not None:
                self.logs.stage(
                    "Decisions",
                    logrows.decision_entity(rec.event_id, rec.event_type, rec.decision_seq, decision, now),
                )
                result.decisions.append(to_result(rec.event_id, decision, now))
                _measure(rec, decision)
        return done.sends

    def _shadow(self, rec: EventRecord, fleet: FleetView, now: datetime) -> Optional[dict]:
        """The shadow policy's verdict on `rec` (decided on the same facts, before the live one applies)."""
        verdict = decide(rec, fleet, self.shadow, now, self.config)  # type: ignore[arg-type]
        if verdict.kind == "send":
            fleet.mark_impacting(rec, now)  # later events see it in the shadow's budgets
        summary = shadow_record(rec, verdict, now)
        if summary is not None:
            rec.shadow, rec.shadow_seq = summary, rec.shadow_seq + 1
        return summary

    def _commit(self, changed: List[Tuple[EventRecord, Optional[dict]]], now: datetime) -> None:
        for i in range(0, len(changed), EVENTS_PER_COMMIT):
            chunk = changed[i : i + EVENTS_PER_COMMIT]
            self.state.commit(Changes(events={rec.event_id: rec for rec, _ in chunk}), now)


def apply(
    rec: EventRecord, verdict: Verdict, now: datetime, owed: Optional[Set[str]] = None
) -> Optional[dict]:
    """Apply a verdict to a working copy: the decision taken (None when nothing new). Keys of the
    alerts it makes the event owe are added to `owed`."""
    out = rec.outstanding  # a property: None as soon as its result is set
    if verdict.timed_out and out is not None:
        out.result, out.result_at = "timeout", now
        if verdict.timeout_cause:
            _owe_timeout_alert(rec, out, verdict.timeout_cause, now, owed)
    if not is_new(rec, verdict):
        return None
    message_id = None
    if verdict.kind == "send" and verdict.send is not None:
        send = verdict.send
        leader = send.leader
        incarnation = leader.incarnation if leader.incarnation is not None else -1
        message = build_message(
            rec.event_id,
            leader.vm_id,
            leader.name,
            send.message_action,
            verdict.decided_by,
            verdict.reason,
            incarnation,
            now,
            send.expires_at,
        )
        message_id = message["messageId"]
        rec.approvals.append(
            Approval(
                send.attempt,
                message_id,
                leader.vm_id,
                leader.name,
                queue_name(leader.vm_id),
                send.message_action,
                verdict.decided_by,
                now,
                send.expires_at,
                sent=False,
                message=message,
                lease_until=now + SEND_LEASE,
            )
        )
    if verdict.kind == "send" and verdict.arm is not None:
        # the path is chosen here, on the event row, committed under the head's If-Match before ARM is called
        arm_id = arm_event_id(rec)
        rec.approvals.append(arm_attempt(rec.event_id, verdict.arm, verdict.decided_by, now, arm_id))
    decision = record(rec, verdict, now, message_id)
    if verdict.action == "operator-release":
        rec.operator_hold = False
    if verdict.decided_by.startswith(HAND_DECIDERS) and verdict.action == "operator-hold":
        rec.operator_hold = True
        if out is not None and out.revocable(now):  # committed, never enqueued, its sender gone
            out.revoked, out.message = True, None
    if verdict.alert == "no-leader":
        if owed is not None:
            owed.add(f"{rec.event_id}:no-leader")
        owe(
            rec,
            Alert(
                f"{rec.event_id}:no-leader",
                "no-leader",
                "critical",
                f"{rec.event_type} {rec.event_id}: no live VM can approve it",
                "No VM in Resources has a live forwarder; the event starts at NotBefore.",
                now,
                rec.event_id,
                rec.status,
                next_try=now + ALERT_LEASE,
            ),
        )
    return decision


def _measure(rec: EventRecord, decision: dict) -> None:
    """A committed decision's metrics (and its se.decision log line)."""
    metrics.decision(decision["action"], decision["rule"], event_id=rec.event_id, event_type=rec.event_type,
                     state=decision["state"])
    if decision["action"] == "failover" and len(rec.approvals) >= 2:
        metrics.approval_failed_over(event_id=rec.event_id, event_type=rec.event_type,
                                     from_vm_id=rec.approvals[-2].vm_id)


def end_stale(rec: EventRecord, why: str, now: datetime, owed: Set[str]) -> dict:
    """End an event no VM can still really be in; the decision says why and its status alert is owed."""
    rec.end_stale(now)
    decision = record(rec, Verdict("record", "ended-stale", "ended", "stale", why + "; ended by central",
                                   "warning", "central:stale"), now)
    owed.add(owe_status_alert(rec, now))
    return decision


def _owe_timeout_alert(rec: EventRecord, attempt: Approval, cause: str, now: datetime,
                       owed: Optional[Set[str]]) -> None:
    """An approval that expired unanswered is worth a person's look: central fails over, but the cause
    (a stopped forwarder, a queue the VM cannot read) usually hits the next event too."""
    key = f"{rec.event_id}:approval-timeout:{attempt.attempt}"
    if owed is not None:
        owed.add(key)
    owe(rec, Alert(key, "approval-timeout", "warning",
                   f"{rec.event_type} {rec.event_id}: approval to {attempt.vm_name} expired unanswered",
                   f"Attempt {attempt.attempt} ({attempt.action}, sent {attempt.sent_at.isoformat()}) got no "
                   f"result by {attempt.expires_at.isoformat()}. Likely cause: {cause}. Central tries "
                   "another VM of the event, or this one again, until NotBefore.",
                   now, rec.event_id, rec.status, next_try=now + ALERT_LEASE))


def owe(rec: EventRecord, alert: Alert) -> None:
    if not any(a.get("key") == alert.key for a in rec.pending_alerts):
        rec.pending_alerts.append(alert.to_json())


def to_result(event_id: str, d: dict, now: datetime) -> Decision:
    from central.model.times import parse

    return Decision(
        event_id,
        d["action"],
        d["state"],
        d["rule"],
        d["reason"],
        d["severity"],
        d["decidedBy"],
        now,
        d.get("leaderVmId"),
        d.get("leaderVmName"),
        d.get("messageId"),
        parse(d.get("expiresAt")) if d.get("expiresAt") else None,
    )
