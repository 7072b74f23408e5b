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
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple
from zoneinfo import ZoneInfo

from central.model.times import aware, iso
from central.model.vms import VmState
from central.policy import matching
from central.policy import validation as policy_check
from central.policy.budgets import Budget

from .matching import Miss

SCHEMA = "policy.schema.json"
MAX_ERRORS = 20
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
class WindowWait:
    """A window seen from one moment: open now, or when it next opens, and whether that is too late."""

    name: str
    open_now: bool
    next_open: Optional[datetime]
    not_before: Optional[datetime]
    zone: str = "UTC"  # the window's own zone: its times are shown there too
    start: int = 0  # the window's local start and end (minutes after midnight), for display
    end: int = 0

    def local(self, when: Optional[datetime]) -> str:
        """`when` in the window's zone, e.g. "Sat 02:00 Europe/Berlin" ("" for UTC windows or none)."""
        if when is None or self.zone == "UTC":
            return ""
        return f"{when.astimezone(ZoneInfo(self.zone)):%a %H:%M} {self.zone}"

    def _when(self) -> str:
        if self.next_open is None:
            return "never"
        local = self.local(self.next_open)
        return iso(self.next_open) + (f" ({local})" if local else "")

    @property
    def after_not_before(self) -> bool:
        """The window opens only once NotBefore has passed (or never): the window cannot apply."""
        if self.open_now:
            return False
        return self.next_open is None or (self.not_before is not None and self.next_open >= self.not_before)

    def reason(self) -> str:
        if self.open_now:
            return f"window {self.name} is open"
        when = self._when()
        if self.after_not_before:
            nb = iso(self.not_before) if self.not_before else "?"
            nb += f" ({self.local(self.not_before)})" if self.local(self.not_before) else ""
            return (f"window {self.name} opens {when}, after NotBefore {nb}: no approval is sent and Azure "
                    "starts the event at NotBefore (a policy can only let events start early)")
        return f"waiting for window {self.name} (next opens {when})"

    def to_json(self) -> Dict[str, Any]:
        hours = f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"
        return {"window": self.name, "openNow": self.open_now, "timeZone": self.zone, "localHours": hours,
                "nextOpen": iso(self.next_open) if self.next_open else None,
                "nextOpenLocal": self.local(self.next_open) or None,
                "opensAfterNotBefore": self.after_not_before, "reason": self.reason()}


def window_wait(window: Window, now: datetime, not_before: Optional[datetime]) -> WindowWait:
    """The window's state for an event at `now` (the decide code's "waiting-window" reason)."""
    now = aware(now)
    shown = {"zone": window.zone, "start": window.start, "end": window.end}
    if window.contains(now):
        return WindowWait(window.name, True, now, not_before, **shown)
    return WindowWait(window.name, False, window.next_open(now), not_before, **shown)


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
        return matching.fits(self.match, event_type, source, duration, vms)

    def misses(self, event_type: str, source: str, duration: int, vms: Sequence[VmState]) -> List[Miss]:
        """Why this rule does not fit (empty: it fits); see central/policy/matching.py."""
        return matching.misses(self.match, event_type, source, duration, vms)


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

    @property
    def needs_group_sizes(self) -> bool:
        """A percentage budget needs every known VM of a group (a read of every VM row per decision pass)."""
        return any(b.percent is not None for b in self.budgets.values())

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


def load(text: Optional[str]) -> Policy:
    """Parse POLICY_JSON. Empty or None -> the built-in defaults. Invalid -> PolicyError."""
    if text is None or not text.strip():
        return Policy(DEFAULT_RULES, {}, {}, "defaults")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise PolicyError([{"path": "/", "message": f"not JSON: {exc}"}]) from None
    errs = policy_check.document_errors(doc)  # schema and semantic errors, all at once
    if errs:
        shown = [{"path": e.path, "message": e.message} for e in errs[:MAX_ERRORS]]
        if len(errs) > MAX_ERRORS:  # health() and the alert carry the list: keep it bounded
            shown.append({"path": "/", "message": f"... and {len(errs) - MAX_ERRORS} more (se-policy check)"})
        raise PolicyError(shown)
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
    budget_map = {
        name: Budget(
            name, b["groupBy"], b.get("tag", ""), b.get("maxImpacted", 1), b.get("maxImpactedPercent")
        )
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
    return Policy(rules, windows, budget_map, "setting")


def fallback(error: PolicyError) -> Policy:
    """The policy used while POLICY_JSON is invalid: hold everything (Azure's own behaviour)."""
    return Policy((FALLBACK_RULE,), {}, {}, "fallback", errors=error.errors)
