"""Acting on committed decisions: approval messages to the VMs' queues and alerts to the webhook.

Both are idempotent and crash-safe, because what to do is in the State table before it is done:
- an approval attempt is committed unsent (with its message), sent, then marked sent; an attempt
  still unsent CLAIM_SEND_GRACE after its commit (its instance died between commit and send) is sent
  by any instance's timer: the very message, same messageId (a VM approves an event at most once);
  a send that fails removes the attempt again so the next evaluation retries it; an attempt through ARM
  (central.runtime.arm_approvals) is the same, its "message" the acknowledge call;
- an alert is owed (in its event's row, or its own row) from the commit that caused it until it is
  delivered or given up: at least once, with a stable idempotency key, surviving restarts. Only the
  committing instance tries at once; others wait for the lease (`nextTry`) before they try.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, Dict, List, Optional, Set, Tuple

from azure.core.exceptions import AzureError

from central.model.alert import ALERT_LEASE, Alert, Delivery
from central.model.clone import clone_event
from central.model.events import SEND_LEASE, SEND_MARGIN, Approval, EventRecord
from central.store import log_rows as logrows
from central.store.fleet_state import EVENTS_PER_COMMIT, Changes, FleetState
from central.store.tables import Conflict, StoreError, TableLog
from central.telemetry import metrics

from . import arm_approvals
from .alert_rules import DEFAULT_FLOOR, build, given_up, is_due, lease, next_try, quiet_status, row_op
from .approval_queue import ApprovalSender
from .evaluator import ToSend
from .results import BatchResult
from .webhook import WebhookAlerter

log = logging.getLogger("central.act")  # stable: docs and queries select on it

CLAIM_SEND_GRACE = int(SEND_LEASE.total_seconds())  # an unsent attempt's instance has this long to send it
MAX_TRIES = 8


@dataclass
class Marks:
    """A change to commit on some events (`change` returns False where it does not apply)."""

    event_ids: List[str]
    change: Callable[[EventRecord], bool]
    bookkeeping: bool  # FleetState.commit's: no decision about another event reads what it changes

    def joined(self, other: Marks) -> Marks:
        """Both changes, for one commit (bookkeeping only if both are)."""
        parts = ((set(self.event_ids), self.change), (set(other.event_ids), other.change))

        def both(rec: EventRecord) -> bool:
            return any([change(rec) is not False for ids, change in parts if rec.event_id in ids])

        return Marks(list(dict.fromkeys([*self.event_ids, *other.event_ids])), both,
                     self.bookkeeping and other.bookkeeping)


class Actor:
    def __init__(
        self, state: FleetState, logs: TableLog, sender: ApprovalSender, alerter: WebhookAlerter,
        arm: Optional[arm_approvals.ArmApprover] = None,
    ) -> None:
        self.state = state
        self.logs = logs
        self.sender = sender
        self.alerter = alerter
        self.arm = arm  # ARM approvals (None: a test's central without one)
        self.owed: Set[str] = set()  # alert keys this call made events owe (delivered at once)
        self.alert_floor = DEFAULT_FLOOR  # STATUS_ALERT_MIN_SEVERITY: status alerts under it go unposted
        self.lost_races = 0  # commits here that lost a race (the service adds them to its calls' results)

    # ---- approvals ------------------------------------------------------------------------------
    def act(self, sends: List[ToSend], owed: Set[str], now: datetime, result: BatchResult,
            extra: Optional[List[Tuple[Alert, Optional[str]]]] = None) -> None:
        """What a call committed, carried out: the approvals sent, then the alerts it made owed delivered,
        the sends' marks committed with the alerts they settle (one commit where there were two)."""
        marks = self._send(sends, now, result)  # (ARM answers may owe alerts too: self.owed)
        self.deliver(now, result, mine=sorted(owed | self.owed), extra=extra, marks=marks)

    def send_approvals(self, todo: List[ToSend], now: datetime, result: BatchResult) -> None:
        """`_send`, its marks committed at once."""
        marks = self._send(todo, now, result)
        if marks is not None:
            self._update_many(marks.event_ids, now, marks.change, bookkeeping=marks.bookkeeping)

    def _send(self, todo: List[ToSend], now: datetime, result: BatchResult) -> Optional[Marks]:
        """Send each committed attempt while its send lease holds; returns the marks to commit (sent; a
        send the queue refuses removes its attempt: the next evaluation tries again). The lease is
        checked against the time elapsed since the call began: a slow queue cannot stretch it. ARM
        attempts (central.runtime.arm_approvals) are called after the queue sends, one call per owner;
        what ARM answered is committed here, at once (it may raise alerts this call delivers)."""
        done: Dict[str, int] = {}
        failed: Dict[str, int] = {}
        arm_items: List[Tuple[str, Approval]] = []
        skipped: Dict[str, int] = {}
        started = time.monotonic()
        for item in todo:
            rec = self._active(item.event_id)
            attempt = rec.approvals[item.attempt - 1] if rec and len(rec.approvals) >= item.attempt else None
            if attempt is None:
                continue
            at = now + timedelta(seconds=time.monotonic() - started)
            if not attempt.may_send(at):
                if not attempt.sent and attempt.result is None:
                    log.warning("approval %d of %s: its send lease lapsed before the send; the timer "
                                "takes it over", item.attempt, item.event_id)
                continue
            if attempt.via == "arm":
                if arm_approvals.approved_elsewhere(rec, item.attempt):  # type: ignore[arg-type]
                    skipped[item.event_id] = item.attempt
                else:
                    arm_items.append((item.event_id, attempt))
                continue
            try:
                self.sender.send(attempt.message, now, attempt.expires_at)
            except AzureError as exc:
                result.errors.append(f"approval for {item.event_id} not sent: {exc}"[:500])
                log.error("approval for %s to %s not sent: %s", item.event_id, attempt.vm_name, exc)
                failed[item.event_id] = item.attempt
                continue
            result.approvals_sent += 1
            done[item.event_id] = item.attempt
            metrics.approval_sent(event_id=item.event_id, event_type=rec.event_type if rec else "",
                                  vm_id=attempt.vm_id, first_seen=rec.first_seen if rec else None,
                                  sent_at=now)
        acks = arm_approvals.carry_out(self.arm, arm_items, self._active, self.logs, now, result)
        if not (done or failed or acks or skipped):
            return None
        marks = Marks([*done, *failed, *acks, *skipped],
                      lambda r: self._settle(r, done, failed, acks, skipped, now),
                      # an attempt taken back, revoked or answered by ARM changes budgets: that moves the head
                      bookkeeping=not (failed or acks or skipped))
        if acks or skipped:
            self._update_many(marks.event_ids, now, marks.change, bookkeeping=marks.bookkeeping)
            return None
        return marks

    def _settle(self, rec: EventRecord, done: Dict[str, int], failed: Dict[str, int],
                acks: Dict[str, Tuple[int, arm_approvals.Ack]], skipped: Dict[str, int],
                now: datetime) -> bool:
        if rec.event_id in done:
            return _mark_sent(rec, done[rec.event_id])
        if rec.event_id in failed:
            return _unsend(rec, failed[rec.event_id])
        if rec.event_id in skipped:
            return _revoke_approved(rec, skipped[rec.event_id])
        attempt_no, ack = acks[rec.event_id]
        if arm_approvals.outcome(ack) == "retry":
            self.owed.add(f"{rec.event_id}:arm-unavailable")
            return arm_approvals.retry(rec, attempt_no, ack, now)
        if not arm_approvals.unsettled(rec, attempt_no):
            return False
        decision = arm_approvals.settle(rec, attempt_no, ack, now)
        if decision is not None:
            self.owed.add(f"{rec.event_id}:arm-refused")
            self.logs.stage("Decisions", logrows.decision_entity(rec.event_id, rec.event_type,
                                                                 rec.decision_seq, decision, now))
        return True

    def resend_stale(self, now: datetime, result: BatchResult) -> None:
        """Attempts committed but never sent whose send lease lapsed (their instance died, or was too
        slow): take a new lease (If-Match: one instance wins; a hold committed first revokes the attempt
        instead), then send the very message and mark it sent."""
        for rec, _ in list(self.state.active.values()):
            out = rec.outstanding
            if out is None or out.sent or out.message is None or not out.revocable(now):
                continue  # nothing to send, or a live lease: its holder is sending it
            if rec.operator_hold:  # held since its commit: nobody sends it any more
                self._update(rec.event_id, now, lambda r, n=out.attempt: _revoke(r, n, now))
                continue
            if out.expires_at <= now + SEND_MARGIN:
                continue  # too late to matter: it times out and the next evaluation fails over
            if not self._update(rec.event_id, now, lambda r, n=out.attempt: _take_lease(r, n, now)):
                continue  # revoked, sent or leased meanwhile
            self.send_approvals([ToSend(rec.event_id, out.attempt)], now, result)
            log.warning("approval %d of %s was committed but not sent by its instance (a crash?); "
                        "re-sent under a new lease", out.attempt, rec.event_id)

    # ---- alerts ---------------------------------------------------------------------------------
    def deliver(
        self,
        now: datetime,
        result: BatchResult,
        mine: Optional[List[str]] = None,
        extra: Optional[List[Tuple[Alert, Optional[str]]]] = None,
        marks: Optional[Marks] = None,
    ) -> None:
        """Deliver alerts owed: `mine` (keys this call committed: tried at once), else every alert due
        (the timer: leased first, in one commit, so two instances do not both try). The Alerts log rows
        are written before the alerts stop being owed: a crash in between repeats a POST (same key),
        never loses a row or an alert. `marks` (send_approvals, deferred) are committed with the settled
        alerts, after the log rows; before a failed write of those rows is raised."""
        self.alerter.new_batch()
        owing: Dict[str, List[str]] = {}
        for rec in [self.state.active[e][0] for e in self.state.active.owing]:
            keys = [
                a["key"]
                for a in rec.pending_alerts
                if (mine is not None and a["key"] in mine) or (mine is None and is_due(a, now))
            ]
            if keys:
                owing[rec.event_id] = keys
        if mine is None and owing:
            leased = self._update_many(list(owing), now, lambda r: lease(r, owing[r.event_id], now),
                                       bookkeeping=True)
            owing = {k: v for k, v in owing.items() if k in leased}
        outcomes: Dict[str, Dict[str, Tuple[Delivery, Alert]]] = {}
        for event_id, keys in owing.items():
            rec = self._active(event_id)
            for raw in rec.pending_alerts if rec else []:
                if raw["key"] in keys:
                    alert = build(rec, Alert.from_json(raw))  # type: ignore[arg-type]
                    if quiet_status(alert.kind, alert.severity, self.alert_floor):
                        # owed before its severity was known (decided later), or by an instance set lower
                        metrics.alert(alert.kind, "below-floor")
                        delivery = Delivery(False, 0, quiet=True)
                    else:
                        delivery = self._post(alert, result)
                    outcomes.setdefault(event_id, {})[raw["key"]] = (delivery, alert)
        rows_done = [(alert, etag, self._post(alert, result)) for alert, etag in extra or []]
        for found in outcomes.values():
            for delivery, alert in found.values():
                if not delivery.quiet:
                    self.logs.stage("Alerts", logrows.alert_entity(alert, delivery, self.alerter.fmt))
        for alert, _, delivery in rows_done:
            self.logs.stage("Alerts", logrows.alert_entity(alert, delivery, self.alerter.fmt))
        if outcomes or rows_done:
            try:
                self.logs.flush()
            except StoreError:
                if marks is not None:  # the sends happened: mark them, or the timer sends them again
                    self._update_many(marks.event_ids, now, marks.change, bookkeeping=marks.bookkeeping)
                raise
        if outcomes or marks is not None:
            settle = Marks(list(outcomes), lambda r: self._settle_event(r, outcomes[r.event_id], now), True)
            if marks is not None:
                settle = marks.joined(settle)
            self._update_many(settle.event_ids, now, settle.change, bookkeeping=settle.bookkeeping)
        for alert, etag, delivery in rows_done:
            self._settle_row(alert, etag, delivery, now)

    def due_rows(self, now: datetime) -> List[Tuple[Alert, Optional[str]]]:
        """Alerts owed by no event and due: leased (If-Match) so one instance tries each."""
        out: List[Tuple[Alert, Optional[str]]] = []
        for alert, etag in self.state.due_alert_rows(now):
            alert.next_try = now + ALERT_LEASE
            try:
                etags = self.state.store.transact("State", [row_op(alert, etag)])
            except Conflict:
                continue  # another instance leased it
            out.append((alert, etags[0]))
        return out

    def _post(self, alert: Alert, result: BatchResult) -> Delivery:
        alert.rounds += 1
        delivery = self.alerter.send(alert)
        metrics.alert(alert.kind, delivery.outcome)
        if delivery.sent:
            result.alerts_sent += 1
        elif delivery.logged:
            result.alerts_logged += 1
        else:
            result.alerts_failed += 1
        return delivery

    def _settle_event(
        self, rec: EventRecord, outcomes: Dict[str, Tuple[Delivery, Alert]], now: datetime
    ) -> bool:
        kept = []
        for raw in rec.pending_alerts:
            found = outcomes.get(raw["key"])
            if found is None:
                kept.append(raw)
                continue
            delivery, alert = found
            done = delivery.sent or delivery.quiet or not self.alerter.url or given_up(alert)
            if not done:
                alert.next_try, alert.error = next_try(alert, now), delivery.error  # a timer run retries it
                kept.append(alert.to_json())
        rec.pending_alerts = kept
        return True

    def _settle_row(self, alert: Alert, etag: Optional[str], delivery: Delivery, now: datetime) -> None:
        done = delivery.sent or not self.alerter.url or given_up(alert)
        if done:
            if etag:
                self.state.forget_alert_row(alert, etag)
            return
        alert.next_try, alert.error = next_try(alert, now), delivery.error
        try:
            self.state.store.transact("State", [row_op(alert, etag)])
        except Conflict:
            pass

    # ---- one event's read-modify-write under the head ------------------------------------------
    def _active(self, event_id: str) -> Optional[EventRecord]:
        found = self.state.active.get(event_id)
        return found[0] if found else None

    def _update(self, event_id: str, now: datetime, change: Callable[[EventRecord], bool]) -> bool:
        """Apply `change` to the current event and commit (re-reading after a lost race). False when
        the change did not apply (the event is gone, or `change` said no)."""
        return event_id in self._update_many([event_id], now, change)

    def _update_many(
        self, event_ids: List[str], now: datetime, change: Callable[[EventRecord], bool],
        bookkeeping: bool = False,
    ) -> Set[str]:
        """`change` applied to each current event, committed together (EVENTS_PER_COMMIT per transaction);
        re-read and re-applied after a lost race (every change here is idempotent). `bookkeeping`: no
        decision about another event reads what `change` changes (FleetState.commit)."""
        for _ in range(MAX_TRIES):
            changes: Dict[str, EventRecord] = {}
            for event_id in event_ids:
                rec = self._active(event_id)
                if rec is None:
                    continue
                mine = clone_event(rec)  # a deep copy, faster (central.model.clone)
                if change(mine) is not False:
                    changes[event_id] = mine
            items = list(changes.items())
            try:
                for i in range(0, len(items), EVENTS_PER_COMMIT):
                    self.state.commit(Changes(events=dict(items[i : i + EVENTS_PER_COMMIT])), now,
                                      bookkeeping=bookkeeping)
                return set(changes)
            except Conflict as exc:  # the state re-read the rows: apply the change again
                self.lost_races += 1
                log.info("acting lost a race (%s): applying again on the re-read rows", exc)
        raise StoreError(f"{len(event_ids)} event(s): still losing races after {MAX_TRIES} re-reads")


def _mark_sent(rec: EventRecord, attempt: int) -> bool:
    if len(rec.approvals) < attempt or rec.approvals[attempt - 1].sent:
        return False
    if rec.approvals[attempt - 1].revoked:  # only if instance clocks disagree by more than SEND_MARGIN
        log.error("approval %d of %s was sent after a hold revoked it (instance clocks out of step?)",
                  attempt, rec.event_id)
    rec.approvals[attempt - 1].sent = True
    rec.approvals[attempt - 1].message = None
    return True


def _revoke_approved(rec: EventRecord, attempt: int) -> bool:
    """An ARM attempt not called because another attempt approved the event meanwhile."""
    if len(rec.approvals) < attempt or rec.approvals[attempt - 1].sent or rec.approvals[attempt - 1].revoked:
        return False
    rec.approvals[attempt - 1].revoked, rec.approvals[attempt - 1].message = True, None
    return True


def _take_lease(rec: EventRecord, attempt: int, now: datetime) -> bool:
    """This instance will send attempt `attempt`: only if it is still the unsent, unrevoked, unleased
    outstanding attempt."""
    out = rec.outstanding
    if out is None or out.attempt != attempt or not out.revocable(now) or out.message is None:
        return False
    out.lease_until = now + SEND_LEASE
    return True


def _revoke(rec: EventRecord, attempt: int, now: datetime) -> bool:
    """Take back an attempt nobody holds a lease to send (the event was held since)."""
    out = rec.outstanding
    if out is None or out.attempt != attempt or not out.revocable(now):
        return False
    out.revoked, out.message = True, None
    return True


def _unsend(rec: EventRecord, attempt: int) -> bool:
    """The queue refused the message: the attempt never happened; the next evaluation tries again."""
    if len(rec.approvals) != attempt or rec.approvals[-1].sent:
        return False
    rec.approvals.pop()
    rec.state = "new"
    rec.decision = dict(rec.decision, reason=f"approval {attempt} could not be sent; retried by the timer")
    return True
