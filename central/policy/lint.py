"""What a valid policy gets wrong in meaning, found on the loaded Policy (pure):

- a rule that can never match because an earlier rule fits every event it fits (error);
- a window that can be closed longer than Microsoft's minimum notice for the rule's event types
  (warning): a policy can only let an event start early; Azure starts it at NotBefore whatever the
  policy says, so such an event, scheduled while the window is closed, starts outside it;
- `"hook": true` on an action that does not read it (warning);
- a window whose start is after its end and which is open more than 12 h a day: most likely swapped
  (warning, with both readings' hours).

Run central.policy.validation.document_errors first: lint needs a document that loads.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .document import DEFAULT_RULES, Policy, Rule, Window
from .matching import NAME_KEYS, has_vm_conditions, has_wildcard, name_fits
from .validation import Finding, pointer

EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
# Microsoft: NotBefore - now when an event first appears, at the least (scale sets may configure
# Terminate up to 15 min; 5 min is the floor). See docs/central.md "What a policy can do".
MINIMUM_NOTICE_SECONDS: Dict[str, int] = {
    "Freeze": 15 * 60,
    "Reboot": 15 * 60,
    "Redeploy": 10 * 60,
    "Preempt": 30,
    "Terminate": 5 * 60,
}
WEEK_MINUTES = 7 * 24 * 60


def _pattern_covers(wide: str, narrow: str) -> bool:
    """Every value `narrow` fits, `wide` fits too (conservative: may say no when it is so)."""
    if wide == "*" or wide.casefold() == narrow.casefold():
        return True
    return not has_wildcard(narrow) and name_fits(narrow, [wide])


def _tag_covers(wide: Any, narrow: Any) -> bool:
    wides = [wide] if isinstance(wide, str) else list(wide)
    narrows = [narrow] if isinstance(narrow, str) else list(narrow)
    return all(
        any(w == "*" or w == n or (not has_wildcard(n) and fnmatchcase(n, w)) for w in wides) for n in narrows
    )


def covers(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> bool:
    """True when every event (and VM set) that fits `later` also fits `earlier`."""
    for key in ("eventTypes", "eventSources"):
        if key in earlier and not (key in later and set(later[key]) <= set(earlier[key])):
            return False
    if "durationInSeconds" in earlier:
        wide, narrow = earlier["durationInSeconds"], later.get("durationInSeconds") or {}
        if wide.get("min", -1) > narrow.get("min", -1):
            return False
        if narrow.get("max", float("inf")) > wide.get("max", float("inf")):
            return False
    if not has_vm_conditions(earlier):
        return True
    if not has_vm_conditions(later):
        return False  # `later` also fits events with no VM central knows; `earlier` does not
    for key in NAME_KEYS:
        if key in earlier and not (
            key in later and all(any(_pattern_covers(w, n) for w in earlier[key]) for n in later[key])
        ):
            return False
    later_tags = later.get("tags") or {}
    return all(tag in later_tags and _tag_covers(want, later_tags[tag])
               for tag, want in (earlier.get("tags") or {}).items())


def shadowed(rules: Sequence[Rule]) -> List[Finding]:
    out: List[Finding] = []
    for i, rule in enumerate(rules):
        for j in range(i):
            if covers(rules[j].match, rule.match):
                out.append(Finding(
                    pointer(["rules", i]),
                    f"rule {rule.name!r} can never match: rule {rules[j].name!r} (/rules/{j}) comes first "
                    "and fits every event it fits",
                    f"move {rule.name!r} above {rules[j].name!r}, narrow {rules[j].name!r}, or remove it",
                    code="shadowed-rule"))
                break
    return out


def _open_minutes(window: Window) -> List[bool]:
    """Minute-of-week (local, Monday 00:00 = 0) -> open. DST shifts are ignored (an hour at most)."""
    week = [False] * WEEK_MINUTES
    length = (window.end - window.start) % (24 * 60) or 24 * 60
    for day in window.days:
        first = day * 24 * 60 + window.start
        for minute in range(first, first + length):
            week[minute % WEEK_MINUTES] = True
    return week


def longest_closed_minutes(window: Window) -> int:
    """The longest stretch, in minutes, the window stays closed (the week wraps around)."""
    week = _open_minutes(window)
    if not any(week):
        return WEEK_MINUTES
    best = run = 0
    for is_open in week + week:
        run = 0 if is_open else run + 1
        best = max(best, run)
    return min(best, WEEK_MINUTES)


def _duration(minutes: int) -> str:
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{mins} min" if mins else ""]
    return " ".join(p for p in parts if p) or "0 min"


def _notice(seconds: int) -> str:
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min"


def window_notice(index: int, rule: Rule, window: Optional[Window]) -> List[Finding]:
    if rule.action != "approve-in-window" or window is None:
        return []
    closed = longest_closed_minutes(window)
    kinds = [t for t in rule.match.get("eventTypes", EVENT_TYPES) if closed * 60 > MINIMUM_NOTICE_SECONDS[t]]
    if not kinds:
        return []
    notices = ", ".join(f"{t} {_notice(MINIMUM_NOTICE_SECONDS[t])}" for t in kinds)
    return [Finding(
        pointer(["rules", index, "window"]),
        f"window {window.name!r} can stay closed for {_duration(closed)}, longer than the minimum notice "
        f"({notices}): such an event scheduled while it is closed starts at its NotBefore, outside the "
        "window. A policy can only let events start early; NotBefore is Azure's",
        "keep the rule if starting early inside the window is what you want; nothing in a policy can "
        "move an event past NotBefore",
        severity="warning", code="window-after-notice")]


def _clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def window_swapped(window: Window) -> List[Finding]:
    """An end before start reads as an overnight window; open longer than it is closed, it is most likely a
    start and end swapped (06:00-02:00 is 20 h open, 02:00-06:00 the 4 h meant)."""
    if window.end >= window.start or window.end == 0:  # ..-00:00 is "until midnight", meant that way
        return []
    length = window.end - window.start + 24 * 60
    if length <= 12 * 60:
        return []
    start, end = _clock(window.start), _clock(window.end)
    return [Finding(
        pointer(["windows", window.name]),
        f"start {start} is after end {end}: read as an overnight window, open {_duration(length)} a day "
        f"({start} to {end} the next day, {window.zone})",
        f"if you meant {end}-{start} ({_duration(24 * 60 - length)} a day), swap start and end",
        severity="warning", code="window-swapped")]


def hook_unused(index: int, rule: Rule) -> List[Finding]:
    if not rule.hook or rule.action == "approve-in-window":
        return []
    note = "approve-after-hook always runs it" if rule.action == "approve-after-hook" else "it is ignored"
    return [Finding(pointer(["rules", index, "hook"]), f'"hook" is only read by approve-in-window; {note}',
                    'remove "hook", or use "action": "approve-after-hook"', severity="warning",
                    code="hook-unused")]


def own_rules(policy: Policy) -> Sequence[Rule]:
    """The policy's rules without the appended built-in defaults (same objects when appended)."""
    n = len(DEFAULT_RULES)
    tail = policy.rules[-n:]
    if len(tail) == n and all(a is b for a, b in zip(tail, DEFAULT_RULES)):
        return policy.rules[:-n]
    return policy.rules


def lint(policy: Policy) -> List[Finding]:
    """Findings on a loaded policy's own rules (the appended defaults are not judged)."""
    own = own_rules(policy)
    out = shadowed(own)
    for window in policy.windows.values():
        out += window_swapped(window)
    for i, rule in enumerate(own):
        out += window_notice(i, rule, policy.windows.get(rule.window or ""))
        out += hook_unused(i, rule)
    return out

