"""The policy engine on its own: defaults, rule matching, windows, validation errors."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from central.model.vms import VmState
from central.policy import document as policy

VM = VmState("id-1", "web_0", scale_set="web", tags={"role": "web", "env": "prod"})
DB = VmState("id-2", "db0", tags={"role": "db"})


def rule(
    p: policy.Policy, event_type: str, source: str = "Platform", duration: int = -1, vms=(VM,)
) -> policy.Rule:
    return p.rule_for(event_type, source, duration, list(vms))


def test_defaults_follow_microsoft_guidance() -> None:
    p = policy.load("")
    assert p.source == "defaults"
    assert rule(p, "Reboot", "User").action == "approve"
    assert rule(p, "Freeze", duration=5).action == "approve"
    assert rule(p, "Freeze", duration=0).action == "approve"
    assert rule(p, "Freeze", duration=9).action == "approve-after-hook"
    assert rule(p, "Freeze", duration=-1).action == "approve-after-hook"
    for kind in ("Reboot", "Redeploy", "Preempt", "Terminate"):
        assert rule(p, kind).action == "approve-after-hook"


def test_rules_match_in_order_on_type_tags_groups_and_names() -> None:
    p = policy.load(
        json.dumps(
            {
                "version": 1,
                "rules": [
                    {
                        "name": "db-hold",
                        "match": {"tags": {"role": ["db", "sql"]}},
                        "action": "hold",
                        "severity": "critical",
                    },
                    {
                        "name": "web-redeploy",
                        "match": {"eventTypes": ["Redeploy"], "scaleSets": ["WEB"]},
                        "action": "approve",
                    },
                    {
                        "name": "named",
                        "match": {"vmNames": ["web_*"], "eventTypes": ["Terminate"]},
                        "action": "hold",
                    },
                ],
            }
        )
    )
    assert rule(p, "Reboot", vms=[DB]).name == "db-hold"
    assert rule(p, "Reboot", vms=[VM, DB]).name == "db-hold"  # any VM in Resources fits
    assert rule(p, "Redeploy").name == "web-redeploy"
    assert rule(p, "Terminate").name == "named"
    assert rule(p, "Reboot").name == "default:impactful"  # defaults appended
    assert rule(p, "Reboot", vms=[]).name == "default:impactful"  # unknown VMs never fit VM conditions


def test_use_defaults_false_holds_unmatched() -> None:
    p = policy.load(json.dumps({"version": 1, "useDefaults": False, "rules": []}))
    assert rule(p, "Reboot", "User").action == "hold"


@pytest.mark.parametrize(
    "doc, path",
    [
        ({"rules": []}, "/"),  # version missing
        ({"version": 1, "rules": [{"name": "x", "action": "reboot-now"}]}, "/rules/0/action"),
        ({"version": 1, "rules": [{"name": "x", "action": "approve-in-window"}]}, "/rules/0"),
        (
            {"version": 1, "rules": [{"name": "x", "action": "approve-in-window", "window": "nope"}]},
            "/rules/0/window",
        ),
        ({"version": 1, "windows": {"w": {"start": "25:00", "end": "03:00"}}}, "/windows/w/start"),
        (
            {"version": 1, "windows": {"w": {"start": "01:00", "end": "03:00", "timeZone": "Mars/Olympus"}}},
            "/windows/w/timeZone",
        ),
        ({"version": 1, "budgets": {"b": {"groupBy": "tag", "maxImpacted": 1}}}, "/budgets/b"),
        (
            {"version": 1, "rules": [{"name": "x", "action": "approve", "budgets": ["missing"]}]},
            "/rules/0/budgets",
        ),
    ],
)
def test_invalid_policy_gives_a_clear_error_with_the_path(doc, path) -> None:
    with pytest.raises(policy.PolicyError) as info:
        policy.load(json.dumps(doc))
    assert path in [e["path"] for e in info.value.errors]
    assert "POLICY_JSON is invalid" in str(info.value)


def test_not_json_is_a_clear_error() -> None:
    with pytest.raises(policy.PolicyError, match="not JSON"):
        policy.load("{version: 1")


def test_fallback_holds_everything() -> None:
    try:
        policy.load("[]")
    except policy.PolicyError as exc:
        p = policy.fallback(exc)
    assert p.describe()["valid"] is False
    for kind, source, duration in (("Reboot", "User", -1), ("Freeze", "Platform", 5)):
        assert rule(p, kind, source, duration).action == "hold"


def test_windows_in_a_named_zone_and_overnight() -> None:
    p = policy.load(
        json.dumps(
            {
                "version": 1,
                "windows": {
                    "oslo-nights": {
                        "timeZone": "Europe/Oslo",
                        "days": ["Sat"],
                        "start": "22:00",
                        "end": "02:00",
                    },
                },
                "rules": [{"name": "w", "action": "approve-in-window", "window": "oslo-nights"}],
            }
        )
    )
    win = p.windows["oslo-nights"]
    # 2026-11-21 is a Saturday; Oslo is UTC+1 in November
    assert not win.contains(datetime(2026, 11, 21, 20, 59, tzinfo=timezone.utc))
    assert win.contains(datetime(2026, 11, 21, 21, 0, tzinfo=timezone.utc))  # Sat 22:00 local
    assert win.contains(datetime(2026, 11, 22, 0, 30, tzinfo=timezone.utc))  # Sun 01:30 local, Sat's window
    assert not win.contains(datetime(2026, 11, 22, 1, 0, tzinfo=timezone.utc))  # Sun 02:00 local: closed
    assert not win.contains(
        datetime(2026, 11, 22, 21, 30, tzinfo=timezone.utc)
    )  # Sun 22:30: not a window day
    assert win.next_open(datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)) == datetime(
        2026, 11, 21, 21, 0, tzinfo=timezone.utc
    )


def test_budget_groups() -> None:
    p = policy.load(
        json.dumps(
            {
                "version": 1,
                "budgets": {
                    "ss": {"groupBy": "scaleSet", "maxImpacted": 1},
                    "avset": {"groupBy": "tag", "tag": "avset", "maxImpacted": 2},
                },
            }
        )
    )
    assert p.budgets["ss"].group_of(VM) == "ss:web"
    assert p.budgets["ss"].group_of(DB) is None
    assert p.budgets["avset"].group_of(VmState("x", "x", tags={"avset": "AS1"})) == "avset:as1"
