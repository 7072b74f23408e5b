"""Approvals carried out through ARM (issue 23, point 3): the attempt as the event row records it, the calls
(grouped per owner: one list call for several events), and what each answer does to the event.

Exactly one effective approval per event, across the queue (IMDS) and ARM paths:
- the path is chosen by the pure decision (central.policy.arm_route) and recorded as an Approval attempt
  (`via: "arm"`, unsent, with a send lease) in the event row, committed under the State head's If-Match
  before ARM is called: of two instances deciding at once one commit wins, the other re-reads and finds the
  attempt outstanding (nothing to decide);
- an attempt is never made while another one (queue or ARM) is outstanding and unexpired, and ARM is not
  called for an event another attempt already approved (it is revoked instead);
- an instance that dies between the commit and the call leaves the attempt unsent: once its lease lapses,
  any instance's timer takes a new lease (If-Match: one wins) and makes the very call
  (central.runtime.act.Actor.resend_stale); one that dies after the call and before recording the answer
  makes the next holder call again: acknowledging an event twice is a no-op for Azure ("an approval request
  from either endpoint means the event can start"), as a VM's second IMDS POST is.

Answers: approved -> the event is approved (a Decisions `result` row, decidedBy as decided, the VM column
`arm:<kind>/<name>`); throttled, 5xx or unreachable -> the attempt stays unsent, its lease pushed out by
Retry-After (at least SEND_LEASE), and any instance's timer makes the call again once it lapses (a call
that could not be made at all, no token or ARM unreachable, also pauses this instance's ARM calls for
PAUSE_AFTER_FAILURE seconds); one `arm-unavailable` alert per event;
anything else (403: the role is missing; 404: not this owner's event) -> the approval failed: the event
starts at NotBefore, with a critical `arm-refused` alert.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import requests

from central.model.alert import ALERT_LEASE, Alert
from central.model.events import ARM_PREFIX, SEND_LEASE, Approval, EventRecord
from central.model.owner import Owner
from central.model.times import iso
from central.policy.decide import ArmSend, Verdict, record
from central.store.log_rows import day, safe_key
from central.store.tables import TableLog
from central.telemetry import metrics

from .arm import Ack, ArmAcknowledger, ArmError
from .results import BatchResult
from .settings import CentralSettings, arm_credential

log = logging.getLogger("central.act")
RETRY_STATUSES = (408, 429, 500, 502, 503, 504)
PAUSE_AFTER_FAILURE = 60.0  # seconds without ARM calls after one could not be made (no token, unreachable)




def owner_label(attempt: Approval) -> str:
    """The ARM owner an attempt went to (`virtualMachines/<name>`...), from its vm_name."""
    return attempt.vm_name.removeprefix(ARM_PREFIX)


def arm_attempt(event_id: str, arm: ArmSend, decided_by: str, now: datetime, arm_id: str = "") -> Approval:
    """The attempt committed before the call: its message is the call itself (re-made as is). `arm_id`: the
    EventId as ARM is asked (central.policy.arm_route.arm_event_id), when it is spelled otherwise."""
    call = {"via": "arm", "eventId": event_id, "owner": arm.owner.to_json()}
    if arm_id and arm_id != event_id:
        call["armEventId"] = arm_id
    return Approval(arm.attempt, f"arm-{event_id}-{arm.attempt}", "", ARM_PREFIX + arm.owner.label(), "",
                    "approve", decided_by, now, arm.expires_at, sent=False, message=call,
                    lease_until=now + SEND_LEASE, via="arm")


def outcome(ack: Ack) -> str:
    """approved | retry | refused (pure)."""
    if ack.ok:
        return "approved"
    if ack.status in RETRY_STATUSES or ack.status == 0:
        return "retry"
    return "refused"


class ArmApprover:
    """Calls ARM for committed attempts. The client is built on first use (building central needs no
    identity; only an ARM approval does)."""

    def __init__(self, factory: Callable[[], ArmAcknowledger], pause: float = PAUSE_AFTER_FAILURE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._factory = factory
        self._client: Optional[ArmAcknowledger] = None
        self.pause = pause
        self.clock = clock
        self._paused_until = 0.0

    @property
    def client(self) -> ArmAcknowledger:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def call(self, items: Sequence[Tuple[str, Approval]]) -> Dict[str, Ack]:
        """Acknowledge each (event id, attempt): one call per owner. Never raises: a call that could not be
        made is a retryable Ack (status 0) for each of its events."""
        by_owner: Dict[Owner, List[str]] = {}
        ours: Dict[str, str] = {}  # the id ARM is asked with -> the record's
        for event_id, attempt in items:
            owner = Owner.from_json((attempt.message or {}).get("owner"))
            if owner is None:
                continue
            asked = str((attempt.message or {}).get("armEventId") or event_id)
            ours[asked] = event_id
            by_owner.setdefault(owner, []).append(asked)
        out: Dict[str, Ack] = {}
        for owner, ids in by_owner.items():
            if self.clock() < self._paused_until:  # no token or no ARM a moment ago: do not probe again yet
                acks = [Ack(i, False, 0, "Paused", "ARM calls paused after a failure") for i in ids]
            else:
                acks = self._acknowledge(owner, ids)
            for ack in acks:
                mine = ours.get(ack.event_id, ack.event_id)
                out[mine] = replace(ack, event_id=mine)
        return out

    def _acknowledge(self, owner: Owner, ids: List[str]) -> List[Ack]:
        try:
            return self.client.acknowledge(owner, ids)
        except (ArmError, ValueError) as exc:
            problem = f"{exc}"
        except Exception as exc:  # noqa: BLE001 - azure-identity's own errors: retried, never raised
            problem = f"{type(exc).__name__}: {exc}"
        # a call that could not be made at all (no token, ARM unreachable) would fail the same way on the
        # next timer run: pause (each try may probe every credential of the chain, under the service lock)
        self._paused_until = self.clock() + self.pause
        log.error("ARM acknowledge at %s for %s could not be made (%s); no ARM call for %g s",
                  owner.label(), ", ".join(ids), problem[:500], self.pause)
        return [Ack(i, False, 0, "Unreachable", problem[:500]) for i in ids]


def unsettled(rec: EventRecord, attempt_no: int) -> bool:
    """ARM attempt `attempt_no` has no answer recorded yet (a second settle changes nothing)."""
    if len(rec.approvals) < attempt_no:
        return False
    attempt = rec.approvals[attempt_no - 1]
    return attempt.via == "arm" and attempt.result in (None, "timeout")


def carry_out(approver: Optional[ArmApprover], items: Sequence[Tuple[str, Approval]],
              active: Callable[[str], Optional[EventRecord]], logs: TableLog, now: datetime,
              result: BatchResult) -> Dict[str, Tuple[int, Ack]]:
    """Call ARM for these committed attempts (their send leases held): each answer by event id, with its
    attempt number; the Decisions `result` rows staged, the call counted and measured."""
    if not items:
        return {}
    if approver is None:
        log.error("ARM approvals committed for %s but central has no ARM client",
                  ", ".join(e for e, _ in items))
        return {}
    answers = approver.call(items)
    out: Dict[str, Tuple[int, Ack]] = {}
    for event_id, attempt in items:
        ack = answers.get(event_id)
        if ack is None:
            continue
        out[event_id] = (attempt.attempt, ack)
        rec = active(event_id)
        kind = outcome(ack)
        if kind == "approved":
            result.approvals_sent += 1
            metrics.approval_sent(event_id=event_id, event_type=rec.event_type if rec else "", vm_id="arm",
                                  first_seen=rec.first_seen if rec else None, sent_at=now)
        else:
            result.errors.append(f"ARM approval for {event_id}: HTTP {ack.status} {ack.code}"[:500])
            log.error("ARM approval of %s at %s: HTTP %s %s %s (%s)", event_id, attempt.vm_name, ack.status,
                      ack.code, ack.message, kind)
        if rec is not None:
            logs.stage("Decisions", result_row(rec, attempt, ack, now))
    return out


def settle(rec: EventRecord, attempt_no: int, ack: Ack, now: datetime) -> Optional[dict]:
    """What ARM's answer does to the event (a working copy; check `unsettled` first). Returns the decision
    it takes (a refusal), else None."""
    if not unsettled(rec, attempt_no):
        return None
    attempt = rec.approvals[attempt_no - 1]
    kind = outcome(ack)
    attempt.sent, attempt.message, attempt.lease_until = True, None, None
    attempt.result = "approved" if kind == "approved" else f"arm-{ack.code or ack.status}"
    attempt.result_at = now
    if kind == "approved":
        rec.state = "approved"
        rec.outcome, rec.outcome_at, rec.outcome_vm = "approved", now, attempt.vm_name
        return None
    why = f"ARM refused the approval at {owner_label(attempt)}: HTTP {ack.status} {ack.code} {ack.message}"
    # a forwarder reported it: its VMs' queues carry the next attempt (decide goes round them; ARM is not
    # asked again). Only an event no forwarder ever reported has nothing left.
    carried = bool(rec.reported_by)
    then = "; the next attempt goes through the forwarders of the VMs that reported it" if carried else ""
    decision = record(rec, Verdict("record", "arm-refused" if carried else "approval-failed",
                                   "approving" if carried else "approval-failed", "arm",
                                   (why.strip() + then)[:1000], "critical", "central:arm"), now)
    key = f"{rec.event_id}:arm-refused"
    if not any(a.get("key") == key for a in rec.pending_alerts):
        hint = (" The Function app's identity needs the role Scheduled Events Contributor "
                "(b67fe603-310e-4889-b9ee-8257d09d353d) on that resource or its resource group."
                if ack.status in (401, 403) else "")
        rec.pending_alerts.append(Alert(
            key, "arm-refused", "critical", f"{rec.event_type} {rec.event_id}: ARM refused the approval",
            f"{why.strip()[:1500]}.{hint} "
            + ("Central goes on through the forwarders of the VMs that reported it, and does not ask ARM "
               "again." if carried else
               f"The event starts at NotBefore ({iso(rec.not_before) if rec.not_before else '?'})."),
            now, rec.event_id, rec.status,
            facts={"owner": owner_label(attempt), "status": ack.status, "code": ack.code},
            next_try=now + ALERT_LEASE).to_json())
    return decision


def retry(rec: EventRecord, attempt_no: int, ack: Ack, now: datetime) -> bool:
    """A throttled call, or one that could not be made: the attempt stays recorded and unsent, its send lease
    pushed out (Retry-After, at least SEND_LEASE): any instance's timer makes the very call again once the
    lease lapses (Actor.resend_stale), and the event is not decided again meanwhile. The event owes one
    `arm-unavailable` alert (the first time): until ARM answers, nobody approves it."""
    if len(rec.approvals) < attempt_no:
        return False
    attempt = rec.approvals[attempt_no - 1]
    if attempt.via != "arm" or attempt.sent or attempt.result is not None or attempt.message is None:
        return False
    owner = owner_label(attempt)
    attempt.lease_until = now + max(SEND_LEASE, timedelta(seconds=ack.retry_after or 0))
    rec.decision = dict(rec.decision, reason=f"ARM approval {attempt_no} could not be made "
                        f"(HTTP {ack.status} {ack.code}); made again from {iso(attempt.lease_until)}")
    key = f"{rec.event_id}:arm-unavailable"
    if not any(a.get("key") == key for a in rec.pending_alerts):
        rec.pending_alerts.append(Alert(
            key, "arm-unavailable", "warning" if ack.status in (429, 503) else "critical",
            f"{rec.event_type} {rec.event_id}: central cannot approve it through ARM",
            f"The acknowledge at {owner} could not be made: HTTP {ack.status} {ack.code} {ack.message}"[:1500]
            + ". Central tries again on its timer; no forwarder can carry the approval, so without ARM the "
            f"event starts at NotBefore ({iso(rec.not_before) if rec.not_before else '?'}). Check "
            "ARM_ENDPOINT and the Function app's identity.",
            now, rec.event_id, rec.status, facts={"owner": owner, "status": ack.status, "code": ack.code},
            next_try=now + ALERT_LEASE).to_json())
    return True


def approved_elsewhere(rec: EventRecord, attempt_no: int) -> bool:
    """Another attempt of this event (a late VM result) already approved it: ARM is not called."""
    return any(a.result == "approved" for a in rec.approvals if a.attempt != attempt_no)


def result_row(rec: EventRecord, attempt: Approval, ack: Ack, now: datetime) -> Dict[str, Any]:
    """The Decisions row of ARM's answer (beside the VMs' `result` rows)."""
    return {"PartitionKey": day(now), "RowKey": safe_key(f"{rec.event_id}_result_arm_{attempt.attempt}"),
            "EventId": rec.event_id, "Action": "result", "State": "approved" if ack.ok else outcome(ack),
            "Rule": "", "Reason": f"ARM acknowledge HTTP {ack.status} {ack.code} {ack.message}".strip(),
            "Severity": "info" if ack.ok else "warning", "DecidedBy": attempt.decided_by, "LeaderVmId": "",
            "LeaderVmName": attempt.vm_name, "MessageId": attempt.message_id, "At": now, "ReceivedAt": now,
            "Via": "arm"}


def arm_approver(typed: CentralSettings, settings: Mapping[str, str]) -> ArmApprover:
    """ARM approvals with the Function app's identity, built on first use (ARM_ENDPOINT, ARM_API_VERSION)."""
    def build() -> ArmAcknowledger:
        session = requests.Session()
        session.trust_env = not typed.arm_endpoint.startswith("http://")  # a loopback stand-in: no proxy
        return ArmAcknowledger(arm_credential(settings), typed.arm_endpoint, typed.arm_api_version,
                               session=session)

    return ArmApprover(build)
