"""The decision, as a pure function: one event + the fleet state it needs + policy + now -> Verdict.

No I/O, no storage types: a replay tool can rebuild `EventRecord`s and `VmState`s from recorded history
(the State and Decisions tables) and ask what central decided, or would decide under another policy:

    verdict = decide(event, FleetView(vms_by_name, open_events), policy, now, DecideConfig())

(FleetView: central.policy.fleet_view.)

The caller (central.runtime.evaluator) commits what a verdict says under the store's concurrency control and
only then acts on it; `record()` applies a verdict to an event record (also pure).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Dict, List, Optional, Sequence, Set, Tuple

from central.model.events import EventRecord
from central.model.owner import Owner
from central.model.times import iso
from central.model.vms import VmState

from .arm_route import agentless, arm_owner, arm_refused, platform_vms
from .budgets import Budget, BudgetBlock
from .document import Policy, Rule, window_wait
from .fleet_view import WAITING_BUDGET, FleetView
from .leader import elect, fresh, timeout_cause
from .verdict import HAND_DECIDERS, NOTHING, ArmSend, Send, Verdict, arm_label, is_new, record, shadow_record
from .witness import WitnessRules

# A VM named in an event's Resources counts against its groups' budgets once it reported the event
# itself, while its forwarder is silent (it cannot report: assume the worst), or for this long after the
# event was first seen (its own report is on the way). A made-up event naming other, live VMs therefore
# holds their budgets for at most this long (central.intake.authz; docs/security.md).
# (WitnessRules.report_grace's default, REPORT_GRACE_SECONDS; central.policy.witness bounds it per reporter)
REPORT_GRACE = timedelta(seconds=120)
# An approval carried out. `completed` and `post-hook-failed` are not: the forwarder's recovery step reports
# them when an event leaves IMDS, also for one central held (Azure started it at NotBefore) or whose
# pre-approve hook failed, so they record how the event ended and never that it was approved.
DONE_OUTCOMES = ("approved",)
END_OUTCOMES = ("completed", "post-hook-failed")
REFUSED_OUTCOMES = ("rejected", "hook-failed")
# approve-in-window whose window opens only after NotBefore: no approval is ever sent, Azure starts the event
# at NotBefore. One name for it in the event view, the fleet view and `se-policy explain`.
STARTS_AT_NOTBEFORE = "starts-at-notbefore"
OPERATOR_RULE = "operator"  # the rule of every operator decision; decidedBy says who ("operator:<name>")


@dataclass(frozen=True)
class DecideConfig:
    result_timeout: timedelta = timedelta(seconds=120)  # APPROVAL_RESULT_TIMEOUT_SECONDS
    # APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS: a hook-then-approve attempt's (the leader drains first)
    hook_result_timeout: timedelta = timedelta(seconds=360)
    liveness: timedelta = timedelta(seconds=300)  # LEADER_LIVENESS_SECONDS
    policy_error: str = ""  # the invalid POLICY_JSON's errors, when the fallback policy runs
    witness: WitnessRules = field(default_factory=WitnessRules)  # what each witness's word counts for


def confirmed(event: EventRecord) -> bool:
    """An approval of this event was confirmed, whatever came after it (an operator's hold changes the state,
    not this): an attempt's result (its VM's, or ARM's), or the outcome a VM reported without a message (a
    manual or local decision). The same test as central.cli.history's."""
    return event.outcome in DONE_OUTCOMES or any(a.result in DONE_OUTCOMES for a in event.approvals)


def unapprovable(event: EventRecord, now: datetime) -> str:
    """Why no approval may be sent for this event ('' when one may)."""
    if event.ended:
        return f"it has ended ({event.status})"
    if event.status != "Scheduled":
        return f"it is {event.status}, not Scheduled"
    if event.not_before is not None and now >= event.not_before:
        return f"its NotBefore ({iso(event.not_before)}) has passed"
    if confirmed(event):  # (at most once: a second message, or a second ARM acknowledge, would follow)
        return "it is already approved (an approval of it was confirmed)"
    return ""


def decide(
    event: EventRecord, fleet: FleetView, policy: Policy, now: datetime, config: DecideConfig
) -> Verdict:
    """What the policy does with `event` now. Verdict.kind "none" when there is nothing to decide
    (ended, Started, waiting for the leader's result, held by an operator, already approved)."""
    if event.ended or event.status != "Scheduled":
        return NOTHING
    if event.not_before is not None and now >= event.not_before:
        if event.state in ("approved", "expired"):
            return NOTHING
        return Verdict(
            "record",
            "expired",
            "expired",
            "notbefore",
            f"NotBefore {iso(event.not_before)} passed without a confirmed approval; Azure starts it",
            # the event's own severity (its rule's, as last decided; never decided: its rule's now): the start
            # nobody approved is news at that severity (central.runtime.alert_rules.status_severity)
            event.decision.get("severity") or _rule_of(event, fleet, policy)[0].severity,
            "policy:notbefore",
        )
    out = event.outstanding
    timed_out, cause = False, ""
    if out is not None:
        if now < out.expires_at:
            return NOTHING  # waiting for the leader's result
        timed_out = True
        if not out.revoked:  # a revoked attempt was taken back by an operator's hold: nothing to explain
            cause = timeout_cause(out, fleet.vms_by_name.get(out.vm_name), now, fleet.liveness)
    if event.operator_hold or event.state in ("approved", "approval-failed"):
        return Verdict("none", timed_out=timed_out, timeout_cause=cause)
    verdict = _by_policy(event, fleet, policy, now, config, timed_out)
    return replace(verdict, timeout_cause=cause) if cause else verdict


def _rule_of(event: EventRecord, fleet: FleetView, policy: Policy) -> Tuple[Rule, List[VmState]]:
    """The policy's rule for `event` and the VMs it was matched on."""
    vms = fleet.vms_of(event)
    if agentless(event, vms):  # the platform's facts stand in for the forwarders' (arm_route says which)
        vms = platform_vms(event)
    return policy.rule_for(event.event_type, event.event_source, event.duration, vms), vms


def _by_policy(
    event: EventRecord, fleet: FleetView, policy: Policy, now: datetime, config: DecideConfig, timed_out: bool
) -> Verdict:
    rule, vms = _rule_of(event, fleet, policy)
    by = f"policy:{rule.name}"
    last = event.approvals[-1] if event.approvals else None
    failover = timed_out or (last is not None and (last.result in ("timeout", "post-failed")
                                                   or (last.via == "arm" and arm_refused(event))))
    if rule.action == "hold":
        why = ("policy invalid: " + config.policy_error[:500]) if config.policy_error else "policy holds it"
        return Verdict(
            "record",
            "hold",
            "held",
            rule.name,
            why + "; left to NotBefore",
            rule.severity,
            by,
            timed_out=timed_out,
        )
    msg_action = "hook-then-approve" if rule.action == "approve-after-hook" else "approve"
    if rule.action == "approve-in-window":
        window = policy.windows[rule.window or ""]
        msg_action = "hook-then-approve" if rule.hook else "approve"
        wait = window_wait(window, now, event.not_before)
        if not wait.open_now:  # a window that opens only after NotBefore never approves: a state of its own
            return Verdict(
                "record",
                "approve-in-window",
                STARTS_AT_NOTBEFORE if wait.after_not_before else "waiting-window",
                rule.name,
                wait.reason(),
                rule.severity,
                by,
                timed_out=timed_out,
            )
    wait = budget_wait(event, policy.budgets_of(rule), vms, fleet, now)
    if wait:
        return Verdict(
            "record", rule.action, WAITING_BUDGET, rule.name, wait, rule.severity, by, timed_out=timed_out
        )
    action = "failover" if failover else rule.action
    return approval(
        event,
        fleet,
        now,
        config,
        msg_action,
        by,
        f"rule {rule.name}: {rule.action}",
        action,
        rule.severity,
        timed_out,
    )


def budget_wait(
    event: EventRecord, budgets: Sequence[Budget], vms: Sequence[VmState], fleet: FleetView, now: datetime
) -> str:
    """Why this event must wait for a disruption budget ('' when it may go)."""
    for b in budgets:
        mine: Dict[str, Set[str]] = {}
        for vm in vms:
            group = b.group_of(vm)
            if group:
                mine.setdefault(group, set()).add(vm.vm_id)
        for group, members in sorted(mine.items()):
            busy = fleet.busy(b, group, event.event_id, now) - members
            size = len(members)
            if b.percent is not None:
                size = max(fleet.group_size(b, group, now), size)
            limit = b.limit(size)
            if len(busy) + len(members) > limit:
                return BudgetBlock(b.name, group, len(busy), len(members), limit, size).reason()
    return ""


def approval(
    event: EventRecord,
    fleet: FleetView,
    now: datetime,
    config: DecideConfig,
    msg_action: str,
    by: str,
    why: str,
    action: str,
    severity: str,
    timed_out: bool = False,
    via_arm: bool = False,
) -> Verdict:
    """Send the next attempt to the elected leader, or through ARM when no forwarder can carry it (or
    `via_arm`: an operator asked), or say why none can go."""
    rule = _rule(by)
    out = event.outstanding
    timed = {out.vm_id} if timed_out and out is not None else frozenset()
    leader = elect(event, fleet.vms_by_name, now, config.liveness, timed)
    # ARM when no named VM's forwarder is left to try first; never again once it refused (see arm_refused)
    if via_arm or (not arm_refused(event) and (leader is None or not fresh(event, leader, timed))):
        owner = arm_owner(event, fleet.vms_of(event))
        if owner is not None:
            return _through_arm(event, fleet, owner, now, config, msg_action, by, why, action, severity,
                                timed_out, leader, via_arm)
    if leader is None:
        return Verdict(
            "record",
            action,
            "no-leader",
            rule,
            "no live forwarder among Resources "
            + ", ".join(event.resources[:10])
            + "; waiting (left to NotBefore if none comes)",
            "critical",
            by,
            timed_out=timed_out,
            alert="no-leader",
        )
    expires = _expiry(event, now, config, msg_action)
    if expires is None:
        return Verdict("record", action, "expired", rule, "too close to NotBefore to send an approval",
                       severity, by, timed_out=timed_out)
    attempt = len(event.approvals) + 1
    reason = f"{why}; approval {attempt} ({msg_action}) to leader {leader.name}, expires {iso(expires)}"
    if action == "failover" and event.approvals:
        reason = "leader " + _no_result(event) + reason
    return Verdict(
        "send",
        action,
        "approving",
        rule,
        reason,
        severity,
        by,
        Send(leader, msg_action, expires, attempt),
        timed_out=timed_out,
    )


def _through_arm(event: EventRecord, fleet: FleetView, owner: Owner, now: datetime, config: DecideConfig,
                 msg_action: str, by: str, why: str, action: str, severity: str, timed_out: bool,
                 leader: Optional[VmState], via_arm: bool) -> Verdict:
    rule = _rule(by)
    expires = _expiry(event, now, config)
    if expires is None:
        return Verdict("record", action, "expired", rule, "too close to NotBefore to approve through ARM",
                       severity, by, timed_out=timed_out)
    if via_arm:
        cause = "asked for by the operator"
    elif agentless(event, fleet.vms_of(event)):
        cause = "no VM in Resources has a forwarder (agentless)"
    elif leader is None:
        cause = "failover ran out: no live forwarder among Resources " + ", ".join(event.resources[:10])
    else:
        cause = "failover ran out: every live forwarder among Resources already had a try"
    attempt = len(event.approvals) + 1
    reason = f"{why}; approval {attempt} through ARM at {owner.label()} ({cause})"
    if msg_action == "hook-then-approve":
        reason += "; no pre-approve hook runs (ARM approves without the VM)"
    if action == "failover" and event.approvals:
        reason = _no_result(event) + reason
    return Verdict("send", action, "approving", rule, reason, severity, by, None, timed_out=timed_out,
                   arm=ArmSend(owner, expires, attempt))


def _rule(by: str) -> str:
    """The rule a decision by `by` records: "operator" for a decision by hand, else the policy rule's name."""
    return OPERATOR_RULE if by.startswith(HAND_DECIDERS) else by.split(":", 1)[-1]


def _expiry(event: EventRecord, now: datetime, config: DecideConfig,
            msg_action: str = "approve") -> Optional[datetime]:
    """When the next attempt expires: the result timeout (the longer hook one when the leader runs its
    pre-approve hook first: a drain the forwarder's hook_timeout allows must not finish after its message
    expired, and the next leader drain too), never past NotBefore; None when under a second."""
    timeout = config.result_timeout
    if msg_action == "hook-then-approve":
        timeout = max(timeout, config.hook_result_timeout)
    expires = now + timeout
    if event.not_before is not None:
        expires = min(expires, event.not_before)
    return expires if (expires - now).total_seconds() >= 1 else None


def _no_result(event: EventRecord) -> str:
    """A failover's reason starts with the attempt before it: who gave no result, and why."""
    prev = event.approvals[-1]
    return f"{prev.vm_name} gave no result ({prev.result or 'timeout'}); "


__all__ = [
    "NOTHING",
    "ArmSend",
    "DecideConfig",
    "Send",
    "Verdict",
    "arm_label",
    "decide",
    "is_new",
    "record",
    "shadow_record",
    "unapprovable",
]
