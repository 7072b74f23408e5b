"""Why a policy decides what it decides for one event, as a structured trace (pure, no I/O).

`explain(policy, event, vms, now)` walks the rules in order like central does: each rule tried, why
each earlier one did not fit (central.policy.matching.Miss), the deciding rule, its action, and for a window
when it opens, said plainly when that is after NotBefore (then Azure starts the event at NotBefore and
the window changes nothing). Budgets need the fleet: pass `fleet` (central.policy.budgets.FleetState: the VMs
central knows and those already impacted) and the trace says whether the event waits for one; without
it the budgets are listed, not evaluated. `whatif` and the decide code supply the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from central.model.times import aware, iso, parse
from central.model.vms import VmState
from central.policy import budgets as budget_math
from central.policy.decide import STARTS_AT_NOTBEFORE
from central.policy.document import DEFAULT_RULES, Policy, WindowWait, window_wait
from central.policy.lint import EVENT_TYPES
from central.policy.matching import Miss

# What happens, in words an operator reads: the outcomes explain() can give.
OUTCOMES = ("approve", "approve-after-hook", "wait-window", "wait-budget", "hold", "starts-at-notbefore",
            "not-scheduled")


@dataclass(frozen=True)
class EventFacts:
    """What a rule matches on, from one IMDS event."""

    event_id: str
    event_type: str
    source: str
    duration: int
    not_before: Optional[datetime]
    resources: Tuple[str, ...]
    status: str = "Scheduled"

    def to_json(self) -> Dict[str, Any]:
        return {"EventId": self.event_id, "EventType": self.event_type, "EventSource": self.source,
                "DurationInSeconds": self.duration,
                "NotBefore": iso(self.not_before) if self.not_before else "",
                "Resources": list(self.resources), "EventStatus": self.status}


def event_from_json(doc: Mapping[str, Any], default_resources: Sequence[str] = ()) -> EventFacts:
    """An IMDS event (fields as IMDS spells them; only EventType is required). ValueError says why not."""
    if not isinstance(doc, Mapping):
        raise ValueError("the event must be a JSON object with IMDS fields (EventType, NotBefore, ...)")
    kind = doc.get("EventType")
    if kind not in EVENT_TYPES:
        raise ValueError(f"EventType must be one of {', '.join(EVENT_TYPES)}, not {kind!r}")
    text = doc.get("NotBefore") or ""
    not_before = parse(str(text)) if text else None
    if text and not_before is None:
        raise ValueError(f"NotBefore {text!r} is not RFC 1123 (Mon, 11 Apr 2022 22:26:58 GMT) or ISO 8601")
    duration = doc.get("DurationInSeconds", -1)
    if not isinstance(duration, int) or isinstance(duration, bool):
        raise ValueError(f"DurationInSeconds must be an integer (-1 = unknown), not {duration!r}")
    resources = doc.get("Resources", list(default_resources))
    if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
        raise ValueError("Resources must be a list of VM names")
    return EventFacts(str(doc.get("EventId", "")), kind, str(doc.get("EventSource", "Platform")), duration,
                      not_before, tuple(resources), str(doc.get("EventStatus", "Scheduled")))


def vm_from_json(doc: Mapping[str, Any]) -> VmState:
    """A VM as the envelope's data.vm carries it (name required; vmId, resourceId, vmScaleSetName,
    placementGroupId, zone, tags optional). ValueError says why not."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("name"), str) or not doc["name"]:
        raise ValueError('a VM is a JSON object with at least "name" (IMDS compute.name)')
    if "tags" in doc and not isinstance(doc["tags"], Mapping):
        raise ValueError('"tags" must be an object: {"role": "db"}')
    vm = VmState(str(doc.get("vmId") or doc["name"]), doc["name"])
    vm.bind_identity(dict(doc))
    return vm


@dataclass(frozen=True)
class RuleTrace:
    index: int  # position in the policy's rules, defaults included
    name: str
    origin: str  # "policy" | "default"
    fits: bool
    misses: Tuple[Miss, ...] = ()

    def to_json(self) -> Dict[str, Any]:
        return {"index": self.index, "rule": self.name, "origin": self.origin, "fits": self.fits,
                "misses": [m.to_json() for m in self.misses]}


@dataclass
class Explanation:
    event: EventFacts
    now: datetime
    vms: List[str]  # Resources central knows (the VMs given that the event lists)
    unknown_resources: List[str]
    trace: List[RuleTrace]
    rule: str
    action: str
    severity: str
    message_action: Optional[str]  # approve | hook-then-approve | None (nothing sent)
    outcome: str  # one of OUTCOMES
    reason: str
    window: Optional[WindowWait] = None
    budgets: List[Dict[str, Any]] = field(default_factory=list)
    budget_block: Optional[budget_math.BudgetBlock] = None
    fleet_evaluated: bool = False

    def to_json(self) -> Dict[str, Any]:
        return {
            "event": self.event.to_json(), "now": iso(self.now), "vms": self.vms,
            "unknownResources": self.unknown_resources, "rules": [t.to_json() for t in self.trace],
            "decidedBy": self.rule, "action": self.action, "severity": self.severity,
            "messageAction": self.message_action, "outcome": self.outcome, "reason": self.reason,
            "window": self.window.to_json() if self.window else None, "budgets": self.budgets,
            "budgetBlock": self.budget_block.to_json() if self.budget_block else None,
            "fleetEvaluated": self.fleet_evaluated,
        }


def _trace(policy: Policy, event: EventFacts, vms: Sequence[VmState]) -> List[RuleTrace]:
    out: List[RuleTrace] = []
    for i, rule in enumerate(policy.rules):
        missed = rule.misses(event.event_type, event.source, event.duration, vms)
        origin = "default" if any(rule is d for d in DEFAULT_RULES) else "policy"
        out.append(RuleTrace(i, rule.name, origin, not missed, tuple(missed)))
        if not missed:
            break
    return out


def explain(
    policy: Policy,
    event: EventFacts,
    vms: Sequence[VmState],
    now: datetime,
    fleet: Optional[budget_math.FleetState] = None,
) -> Explanation:
    """What the policy does with `event` at `now`, given the VMs central knows among its Resources.

    `vms` not named in the event's Resources are left out (central matches only those).
    """
    now = aware(now)
    known = [vm for vm in vms if vm.name in event.resources]
    unknown = [name for name in event.resources if name not in {vm.name for vm in known}]
    trace = _trace(policy, event, known)
    rule = policy.rule_for(event.event_type, event.source, event.duration, known)
    out = Explanation(event, now, [vm.name for vm in known], unknown, trace, rule.name, rule.action,
                      rule.severity, None, "hold", "")
    if event.status != "Scheduled":
        out.outcome, out.reason = "not-scheduled", f"the event is {event.status}: nothing is left to decide"
        return out
    if event.not_before is not None and now >= event.not_before:
        out.outcome = STARTS_AT_NOTBEFORE
        out.reason = f"NotBefore {iso(event.not_before)} has passed: Azure starts the event"
        return out
    if rule.action == "hold":
        out.reason = f"rule {rule.name}: hold; no approval is sent, the event starts at NotBefore"
        return out
    message = "hook-then-approve" if rule.action == "approve-after-hook" else "approve"
    if rule.action == "approve-in-window":
        message = "hook-then-approve" if rule.hook else "approve"
        out.window = window_wait(policy.windows[rule.window or ""], now, event.not_before)
        if not out.window.open_now:
            out.outcome = STARTS_AT_NOTBEFORE if out.window.after_not_before else "wait-window"
            out.reason = f"rule {rule.name}: {out.window.reason()}"
            return out
    chosen = policy.budgets_of(rule)
    out.budgets = budget_math.limits_for(chosen, known, fleet.known_vms if fleet else [])
    if fleet is not None:
        out.fleet_evaluated = True
        out.budget_block = budget_math.budget_block(chosen, known, fleet)
        if out.budget_block is not None:
            out.outcome, out.reason = "wait-budget", f"rule {rule.name}: {out.budget_block.reason()}"
            return out
    out.message_action = message
    out.outcome = "approve-after-hook" if message == "hook-then-approve" else "approve"
    out.reason = f"rule {rule.name}: {rule.action}" + ("" if fleet is not None or not chosen else
                                                       "; budgets not evaluated (no fleet state given)")
    return out
