"""The policy engine: POLICY_JSON validated against schemas/policy.schema.json, rules matched in
order, maintenance windows in any IANA zone, disruption budgets per group.

An invalid policy raises PolicyError (every reason, with its JSON path). The service then runs the
fallback policy, which holds everything: no approval is sent, so each event starts at its NotBefore
exactly as Azure does without this pipeline; nothing the operator meant to protect is disrupted early.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import schemas

from .vms import VmState

SCHEMA = "policy.schema.json"
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
ACTIONS = ("approve", "approve-after-hook", "approve-in-window", "hold")


class PolicyError(ValueError):
    """POLICY_JSON is not a valid policy; `errors` lists [{"path", "message"}]."""

    def __init__(self, errors: List[Dict[str, str]]) -> None:
        self.errors = errors
        super().__init__(
            "POLICY_JSON is invalid (schemas/policy.schema.json): "
            + "; ".join(f"{e['path']}: {e['message']}" for e in errors[:10])
        )


@dataclass(frozen=True)
class Window:
    name: str
    zone: str
    days: FrozenSet[int]  # 0 = Monday
    start: int  # minutes after local midnight
    end: int  # exclusive; <= start means it runs past midnight

    def contains(self, now: datetime) -> bool:
        local = now.astimezone(ZoneInfo(self.zone))
        minute = local.hour * 60 + local.minute
        if self.start < self.end:
            return local.weekday() in self.days and self.start <= minute < self.end
        # overnight: the part after midnight belongs to the previous day's window
        if minute >= self.start:
            return local.weekday() in self.days
        return minute < self.end and (local.weekday() - 1) % 7 in self.days

    def next_open(self, now: datetime) -> Optional[datetime]:
        """The next instant the window opens (now if open), searched minute-exact over 8 days."""
        if self.contains(now):
            return now
        zone = ZoneInfo(self.zone)
        local = now.astimezone(zone)
        for offset in range(0, 9):
            day = (local + timedelta(days=offset)).replace(hour=0, minute=0, second=0, microsecond=0)
            if day.weekday() not in self.days:
                continue
            candidate = day.replace(hour=self.start // 60, minute=self.start % 60)
            candidate = candidate.replace(tzinfo=zone)
            if candidate > local:
                return candidate.astimezone(now.tzinfo)
        return None


@dataclass(frozen=True)
class Budget:
    name: str
    group_by: str
    tag: str
    max_impacted: int

    def group_of(self, vm: VmState) -> Optional[str]:
        """The group key this VM counts in, or None when the VM is in no group of this kind."""
        value = {
            "scaleSet": vm.scale_set,
            "placementGroup": vm.placement_group,
            "zone": vm.zone,
            "tag": vm.tags.get(self.tag, ""),
        }[self.group_by]
        return f"{self.name}:{value.lower()}" if value else None


@dataclass(frozen=True)
class Rule:
    name: str
    action: str
    match: Dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    window: Optional[str] = None
    hook: bool = False
    severity: str = "warning"
    budgets: Optional[Tuple[str, ...]] = None  # None = every budget

    def fits(self, event_type: str, source: str, duration: int, vms: Sequence[VmState]) -> bool:
        m = self.match
        if "eventTypes" in m and event_type not in m["eventTypes"]:
            return False
        if "eventSources" in m and source not in m["eventSources"]:
            return False
        rng = m.get("durationInSeconds")
        if rng is not None:
            if "min" in rng and duration < rng["min"]:
                return False
            if "max" in rng and duration >= rng["max"]:
                return False
        vm_keys = ("tags", "scaleSets", "placementGroups", "zones", "vmNames")
        if any(k in m for k in vm_keys):
            return any(self._fits_vm(vm) for vm in vms)
        return True

    def _fits_vm(self, vm: VmState) -> bool:
        m = self.match
        for key, want in (m.get("tags") or {}).items():
            have = vm.tags.get(key)
            accepted = [want] if isinstance(want, str) else list(want)
            if have is None or ("*" not in accepted and have not in accepted):
                return False
        if "scaleSets" in m and vm.scale_set.lower() not in {s.lower() for s in m["scaleSets"]}:
            return False
        if "placementGroups" in m and vm.placement_group not in m["placementGroups"]:
            return False
        if "zones" in m and vm.zone not in m["zones"]:
            return False
        return not ("vmNames" in m and not any(fnmatchcase(vm.name, p) for p in m["vmNames"]))


DEFAULT_RULES: Tuple[Rule, ...] = (
    # Microsoft: user-initiated events (a redeploy or reboot someone asked for) are safe to approve.
    Rule("default:user-initiated", "approve", {"eventSources": ["User"]}, severity="info", budgets=()),
    # Microsoft: a Freeze under 9 s (live migration pause) may be approved at once.
    Rule(
        "default:short-freeze",
        "approve",
        {"eventTypes": ["Freeze"], "durationInSeconds": {"min": 0, "max": 9}},
        severity="info",
        budgets=(),
    ),
    # Anything else is impactful: let the VM drain itself (local hook), then approve.
    Rule("default:impactful", "approve-after-hook", {}, severity="warning"),
)

FALLBACK_RULE = Rule("fallback:invalid-policy", "hold", {}, severity="critical", budgets=())


@dataclass
class Policy:
    rules: Tuple[Rule, ...]
    windows: Dict[str, Window]
    budgets: Dict[str, Budget]
    source: str  # "defaults" | "setting" | "fallback"
    errors: List[Dict[str, str]] = field(default_factory=list)

    def rule_for(self, event_type: str, source: str, duration: int, vms: Sequence[VmState]) -> Rule:
        for rule in self.rules:
            if rule.fits(event_type, source, duration, vms):
                return rule
        return Rule("policy:no-rule-matched", "hold", {}, severity="warning", budgets=())

    def budgets_of(self, rule: Rule) -> List[Budget]:
        names: Iterable[str] = self.budgets.keys() if rule.budgets is None else rule.budgets
        return [self.budgets[n] for n in names if n in self.budgets]

    def describe(self) -> Dict[str, Any]:
        return {
            "source": self.source,
            "valid": not self.errors,
            "errors": self.errors,
            "rules": [r.name for r in self.rules],
            "windows": sorted(self.windows),
            "budgets": sorted(self.budgets),
        }


def _clock(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def _semantic_errors(doc: Dict[str, Any]) -> List[Dict[str, str]]:
    """What the schema cannot say: references resolve, zones exist, ranges are not empty."""
    errs: List[Dict[str, str]] = []
    windows = doc.get("windows") or {}
    budgets = doc.get("budgets") or {}
    for name, win in windows.items():
        zone = win.get("timeZone", "UTC")
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            errs.append({"path": f"/windows/{name}/timeZone", "message": f"unknown time zone {zone!r}"})
        if win["start"] == win["end"]:
            errs.append(
                {"path": f"/windows/{name}", "message": "start equals end: the window would never open"}
            )
    for i, rule in enumerate(doc.get("rules") or []):
        if "window" in rule and rule["window"] not in windows:
            errs.append(
                {"path": f"/rules/{i}/window", "message": f"no window named {rule['window']!r} in /windows"}
            )
        if "window" in rule and rule["action"] != "approve-in-window":
            errs.append(
                {"path": f"/rules/{i}/window", "message": "window is only used by action approve-in-window"}
            )
        for b in rule.get("budgets") or []:
            if b not in budgets:
                errs.append({"path": f"/rules/{i}/budgets", "message": f"no budget named {b!r} in /budgets"})
        rng = (rule.get("match") or {}).get("durationInSeconds") or {}
        if "min" in rng and "max" in rng and rng["min"] >= rng["max"]:
            errs.append({"path": f"/rules/{i}/match/durationInSeconds", "message": "min must be below max"})
    names = [r["name"] for r in doc.get("rules") or []]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        errs.append({"path": "/rules", "message": f"rule name {dup!r} is used twice"})
    return errs


def load(text: Optional[str]) -> Policy:
    """Parse POLICY_JSON. Empty or None -> the built-in defaults. Invalid -> PolicyError."""
    if text is None or not text.strip():
        return Policy(DEFAULT_RULES, {}, {}, "defaults")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise PolicyError([{"path": "/", "message": f"not JSON: {exc}"}]) from None
    errs = schemas.errors(SCHEMA, doc) or _semantic_errors(doc)
    if errs:
        raise PolicyError(errs)
    windows = {
        name: Window(
            name,
            w.get("timeZone", "UTC"),
            frozenset(DAYS.index(d) for d in w.get("days", DAYS)),
            _clock(w["start"]),
            _clock(w["end"]) % (24 * 60),
        )
        for name, w in (doc.get("windows") or {}).items()
    }
    budgets = {
        name: Budget(name, b["groupBy"], b.get("tag", ""), b["maxImpacted"])
        for name, b in (doc.get("budgets") or {}).items()
    }
    rules = tuple(
        Rule(
            r["name"],
            r["action"],
            r.get("match") or {},
            r.get("window"),
            bool(r.get("hook", False)),
            r.get("severity", "warning"),
            tuple(r["budgets"]) if "budgets" in r else None,
        )
        for r in doc.get("rules") or []
    )
    if doc.get("useDefaults", True):
        rules = rules + DEFAULT_RULES
    return Policy(rules, windows, budgets, "setting")


def fallback(error: PolicyError) -> Policy:
    """The policy used while POLICY_JSON is invalid: hold everything (Azure's own behaviour)."""
    return Policy((FALLBACK_RULE,), {}, {}, "fallback", errors=error.errors)
