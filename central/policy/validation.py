"""Every error in a policy document at once: the schema's (nested ones resolved to the one that
says most), then what the schema cannot say (references resolve, zones exist, ranges are not empty),
each with its JSON path and a hint. Pure; runs on any JSON value, valid or not.

central.policy.document.load() raises on these; `se-policy check` adds central.policy.lint's findings.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cache
from typing import Any, Dict, FrozenSet, Iterable, List
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from jsonschema.exceptions import ValidationError, best_match

import schemas

SCHEMA = "policy.schema.json"
MAX_MESSAGE = 300  # a hostile document cannot blow up what is logged or alerted


@dataclass(frozen=True)
class Finding:
    path: str  # JSON Pointer into the document ("" = the whole document shown as "/")
    message: str
    hint: str = ""
    severity: str = "error"  # error | warning
    code: str = "schema"

    def to_json(self) -> Dict[str, str]:
        return {"severity": self.severity, "code": self.code, "path": self.path,
                "message": self.message, "hint": self.hint}


def pointer(parts: Iterable[Any]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


@cache
def _zones() -> FrozenSet[str]:
    return frozenset(available_timezones())


def zone_exists(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _hint(err: ValidationError) -> str:
    """A short, actionable hint for one schema error."""
    kind, value, where = err.validator, err.validator_value, list(err.absolute_path)
    last = str(where[-1]) if where else ""
    if kind == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted((err.schema.get("properties") or {}).keys())
        extra = [k for k in err.instance if k not in allowed]
        if allowed:
            guess = did_you_mean(extra[0], allowed) if extra else ""
            return _join(guess, "allowed here: " + ", ".join(allowed))
    if kind == "enum":
        return _join(did_you_mean(err.instance, [str(v) for v in value]),
                     "one of: " + ", ".join(str(v) for v in value))
    if kind == "pattern":
        if last in ("start", "end"):
            return "a 24-hour time with two-digit hours, HH:MM, e.g. 02:00 (an end may be 24:00)"
        if last == "name":
            return "1-64 characters: letters, digits and _ . : -"
        return "names: 1-64 characters, letters, digits and _ . -"
    if kind == "required":
        missing = str(err.message).split("'")[1] if "'" in err.message else ""
        return {
            "window": 'approve-in-window needs "window": the name of one in /windows',
            "tag": 'groupBy "tag" needs "tag": the tag whose value groups the VMs',
            "version": 'add "version": 1',
            "maxImpacted": 'give "maxImpacted" (a count) or "maxImpactedPercent" (1-100 of the group)',
        }.get(missing, f'add "{missing}"' if missing else "")
    if kind == "oneOf" and where and len(where) == 2 and where[0] == "budgets":
        return 'give exactly one of "maxImpacted" (a count) and "maxImpactedPercent" (1-100 of the group)'
    if kind == "const" and last == "version":
        return 'this release reads "version": 1'
    if kind == "type":
        return f"expected {value if isinstance(value, str) else ' or '.join(value)}"
    if kind == "minItems":
        return "give at least one value, or leave the key out"
    if kind == "uniqueItems":
        return "a value is listed twice"
    if kind in ("minimum", "maximum"):
        return f"{kind} {value}"
    return ""


def schema_errors(doc: Any) -> List[Finding]:
    """Every schema error; for oneOf/anyOf the nested error that says most (jsonschema best_match)."""
    out: List[Finding] = []
    for err in schemas.validator(SCHEMA).iter_errors(doc):
        shown = err
        if err.context and err.validator in ("anyOf", "oneOf"):
            nested = best_match(err.context)
            if nested is not None and nested.validator != "required":
                shown = nested
        hint = _hint(shown) or _hint(err)
        if shown.validator == "type" and err.validator == "oneOf":
            hint = "a string or a non-empty list of strings"
        out.append(Finding(pointer(shown.absolute_path), _message(shown)[:MAX_MESSAGE], hint))
    return out


def _message(err: ValidationError) -> str:
    """jsonschema's message, except where it would quote a regex or a whole sub-document."""
    where = list(err.absolute_path)
    if err.validator == "pattern" and where and where[-1] in ("start", "end"):
        return f"{err.instance!r} is not a time HH:MM"
    budget = len(where) == 2 and where[0] == "budgets" and isinstance(err.instance, dict)
    if err.validator == "oneOf" and budget:
        both = all(k in err.instance for k in ("maxImpacted", "maxImpactedPercent"))
        return ("both maxImpacted and maxImpactedPercent given" if both
                else "neither maxImpacted nor maxImpactedPercent given")
    return err.message


def _dict(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def semantic_errors(doc: Any) -> List[Finding]:
    """What the schema cannot say. Tolerates documents that fail the schema (checks what it can)."""
    doc = _dict(doc)
    errs: List[Finding] = []

    def add(where: List[Any], message: str, hint: str, code: str) -> None:
        errs.append(Finding(pointer(where), message[:MAX_MESSAGE], hint, code=code))

    windows, budgets = _dict(doc.get("windows")), _dict(doc.get("budgets"))
    for name, win in windows.items():
        win = _dict(win)
        zone = win.get("timeZone", "UTC")
        if isinstance(zone, str) and not zone_exists(zone):
            add(["windows", name, "timeZone"], f"unknown time zone {zone!r}",
                _join(did_you_mean(zone, _zones()), "an IANA zone name, e.g. Europe/Oslo"), "unknown-zone")
        if "start" in win and win.get("start") == win.get("end"):
            add(["windows", name], "start equals end: the window would never open",
                "for a whole day use 00:00-24:00", "empty-window")
    rules = doc.get("rules") if isinstance(doc.get("rules"), list) else []
    for i, rule in enumerate(rules):
        rule = _dict(rule)
        window = rule.get("window")
        if isinstance(window, str) and window not in windows:
            add(["rules", i, "window"], f"no window named {window!r} in /windows",
                _join(did_you_mean(window, windows), "defined: " + (", ".join(windows) or "none")),
                "unknown-window")
        if "window" in rule and rule.get("action") != "approve-in-window":
            add(["rules", i, "window"], "window is only used by action approve-in-window",
                'set "action": "approve-in-window" or remove "window"', "window-unused")
        for b in rule.get("budgets") if isinstance(rule.get("budgets"), list) else []:
            if isinstance(b, str) and b not in budgets:
                add(["rules", i, "budgets"], f"no budget named {b!r} in /budgets",
                    _join(did_you_mean(b, budgets), "defined: " + (", ".join(budgets) or "none")),
                    "unknown-budget")
        rng = _dict(_dict(rule.get("match")).get("durationInSeconds"))
        low, high = rng.get("min"), rng.get("max")
        if isinstance(low, int) and isinstance(high, int) and low >= high:
            add(["rules", i, "match", "durationInSeconds"], "min must be below max",
                "min is inclusive, max exclusive: {min: 0, max: 9} is 0-8 s", "empty-range")
    names = [_dict(r).get("name") for r in rules]
    for dup in sorted({n for n in names if isinstance(n, str) and names.count(n) > 1}):
        add(["rules"], f"rule name {dup!r} is used twice",
            "rule names must be unique: the decision log names the deciding rule", "duplicate-rule")
    return errs


def document_errors(doc: Any) -> List[Finding]:
    """Schema and semantic errors together (empty: the document is a valid policy)."""
    return sorted(schema_errors(doc) + semantic_errors(doc), key=path_key)


def path_key(finding: Finding) -> List[Any]:
    """Document order: /rules/2 before /rules/10."""
    return [(0, int(p), "") if p.isascii() and p.isdigit() else (1, 0, p) for p in finding.path.split("/")]

