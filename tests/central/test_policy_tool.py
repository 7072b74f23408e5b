"""`se-policy check` and `se-policy explain`: exit codes, every error at once with its path and hint,
each semantic error, explain traces; and the console script as operators get it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import tomllib

from central.cli import se_policy as policy_cli
from central.cli.explain import event_from_json, explain, vm_from_json
from central.policy import document as policy
from central.policy.budgets import FleetState

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str) -> Tuple[int, str]:
    out = io.StringIO()
    code = policy_cli.main(list(argv), out=out)
    return code, out.getvalue()


def write(tmp_path: Path, doc: Any, name: str = "policy.json") -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return str(path)


def check_json(tmp_path: Path, doc: Any, *flags: str) -> Tuple[int, Dict[str, Any]]:
    code, text = run("check", write(tmp_path, doc), "--json", *flags)
    return code, json.loads(text)


def test_check_a_valid_policy_exits_0(tmp_path: Path) -> None:
    code, text = run("check", write(tmp_path, {"version": 1, "rules": [{"name": "a", "action": "approve"}]}))
    assert code == 0 and ": valid: 0 error(s), 0 warning(s)" in text


def test_check_an_empty_file_is_the_defaults_and_valid(tmp_path: Path) -> None:
    assert run("check", write(tmp_path, "  \n"))[0] == 0


def test_check_reports_every_schema_and_semantic_error_at_once_with_paths(tmp_path: Path) -> None:
    """The issue's case: a bad clock and a misspelt zone in one window; before, only the first showed."""
    doc = {
        "version": 1,
        "windows": {"night": {"timeZone": "Europe/Olso", "start": "2:00", "end": "04:00"}},
        "budgets": {"ss": {"groupBy": "scaleSet"}},
        "rules": [
            {"name": "a", "action": "aprove", "match": {"scaleSet": ["web"], "tags": {"role": 5}}},
            {"name": "b", "action": "approve-in-window", "window": "nigth", "budgets": ["nope"]},
        ],
    }
    code, report = check_json(tmp_path, doc)
    assert code == 2 and report["valid"] is False and report["exitCode"] == 2
    paths = {e["path"]: e for e in report["errors"]}
    assert set(paths) == {
        "/windows/night/start",
        "/windows/night/timeZone",
        "/budgets/ss",
        "/rules/0/action",
        "/rules/0/match",
        "/rules/0/match/tags/role",
        "/rules/1/window",
        "/rules/1/budgets",
    }
    assert "Europe/Oslo" in paths["/windows/night/timeZone"]["hint"]
    assert "02:00" in paths["/windows/night/start"]["hint"]
    assert "'approve'" in paths["/rules/0/action"]["hint"]
    assert "'scaleSets'" in paths["/rules/0/match"]["hint"]
    assert "'night'" in paths["/rules/1/window"]["hint"]
    assert "maxImpactedPercent" in paths["/budgets/ss"]["message"]
    assert (
        paths["/rules/0/match/tags/role"]["hint"] == "a string or a non-empty list of strings"
    )  # nested error


def test_check_text_output_lists_each_error_with_path_and_hint(tmp_path: Path) -> None:
    code, text = run(
        "check", write(tmp_path, {"version": 1, "rules": [{"name": "a", "action": "hold", "x": 1}]})
    )
    assert code == 2
    assert "error   /rules/0: Additional properties are not allowed ('x' was unexpected)" in text
    assert "hint: allowed here: action, budgets, hook, match, name, severity, window" in text


@pytest.mark.parametrize(
    "doc, path, code_name",
    [
        (
            {"windows": {"w": {"start": "01:00", "end": "02:00", "timeZone": "Mars/Olympus"}}},
            "/windows/w/timeZone",
            "unknown-zone",
        ),
        ({"windows": {"w": {"start": "01:00", "end": "01:00"}}}, "/windows/w", "empty-window"),
        (
            {"rules": [{"name": "a", "action": "approve-in-window", "window": "w"}]},
            "/rules/0/window",
            "unknown-window",
        ),
        (
            {"rules": [{"name": "a", "action": "approve", "budgets": ["b"]}]},
            "/rules/0/budgets",
            "unknown-budget",
        ),
        (
            {
                "windows": {"w": {"start": "01:00", "end": "02:00"}},
                "rules": [{"name": "a", "action": "approve", "window": "w"}],
            },
            "/rules/0/window",
            "window-unused",
        ),
        (
            {
                "rules": [
                    {"name": "a", "action": "hold", "match": {"durationInSeconds": {"min": 9, "max": 9}}}
                ]
            },
            "/rules/0/match/durationInSeconds",
            "empty-range",
        ),
        (
            {
                "rules": [
                    {"name": "a", "action": "hold"},
                    {"name": "a", "action": "approve", "match": {"eventTypes": ["Freeze"]}},
                ]
            },
            "/rules",
            "duplicate-rule",
        ),
        (
            {
                "rules": [
                    {"name": "all", "action": "hold"},
                    {"name": "later", "action": "approve", "match": {"eventTypes": ["Freeze"]}},
                ]
            },
            "/rules/1",
            "shadowed-rule",
        ),
    ],
)
def test_check_each_semantic_error_exits_2(
    tmp_path: Path, doc: Dict[str, Any], path: str, code_name: str
) -> None:
    code, report = check_json(tmp_path, {"version": 1, **doc})
    assert code == 2
    assert (path, code_name) in [(e["path"], e["code"]) for e in report["errors"]]


def test_check_window_after_minimum_notice_is_a_warning_strict_makes_it_exit_1(tmp_path: Path) -> None:
    doc = {
        "version": 1,
        "windows": {"night": {"start": "02:00", "end": "04:00"}},
        "rules": [
            {
                "name": "redeploy-at-night",
                "match": {"eventTypes": ["Redeploy"]},
                "action": "approve-in-window",
                "window": "night",
            }
        ],
    }
    code, report = check_json(tmp_path, doc)
    assert code == 0 and report["valid"] is True and report["errors"] == []
    [warning] = report["warnings"]
    assert warning["code"] == "window-after-notice" and warning["path"] == "/rules/0/window"
    assert "22 h" in warning["message"] and "Redeploy 10 min" in warning["message"]
    assert "only let events start early" in warning["message"]
    assert check_json(tmp_path, doc, "--strict")[0] == 1


def test_check_not_json_is_invalid_with_the_position(tmp_path: Path) -> None:
    code, report = check_json(tmp_path, '{"version": 1,, }')
    assert (
        code == 2
        and report["errors"][0]["path"] == "/"
        and "line 1 column 15" in report["errors"][0]["message"]
    )


def test_check_missing_file_and_bad_usage_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("check", str(tmp_path / "missing.json"))[0] == 3
    assert "cannot read" in capsys.readouterr().err
    assert run("chek", "x")[0] == 3
    assert run("explain", write(tmp_path, {"version": 1}))[0] == 3  # --event is required
    assert run("explain", write(tmp_path, {"version": 1}), "--event", "{bad")[0] == 3
    assert run("explain", write(tmp_path, {"version": 1}), "--event", '{"EventType": "Nap"}')[0] == 3
    err = capsys.readouterr().err
    assert "--event is not JSON" in err and "EventType must be one of" in err and "Traceback" not in err


POLICY = {
    "version": 1,
    "windows": {"night": {"timeZone": "Europe/Oslo", "start": "02:00", "end": "04:00"}},
    "budgets": {"per-ss": {"groupBy": "scaleSet", "maxImpactedPercent": 50}},
    "rules": [
        {
            "name": "db-hold",
            "match": {"tags": {"role": ["db", "sql"]}},
            "action": "hold",
            "severity": "critical",
        },
        {
            "name": "prod-redeploy-night",
            "match": {"eventTypes": ["Redeploy"], "resourceGroups": ["rg-prod-*"]},
            "action": "approve-in-window",
            "window": "night",
            "hook": True,
        },
    ],
}
WEB_VM = {
    "vmId": "id-web0",
    "name": "web_0",
    "vmScaleSetName": "web",
    "tags": {"role": "web"},
    "resourceId": "/subscriptions/s1/resourceGroups/rg-prod-web/providers/Microsoft.Compute/"
    "virtualMachineScaleSets/web/virtualMachines/0",
}
NOW = "2026-11-21T00:55:00Z"  # 01:55 in Oslo


def explain_json(
    tmp_path: Path, event: Dict[str, Any], *vms: Dict[str, Any], now: str = NOW
) -> Dict[str, Any]:
    args: List[str] = [
        "explain",
        write(tmp_path, POLICY),
        "--event",
        json.dumps(event),
        "--now",
        now,
        "--json",
    ]
    for vm in vms:
        args += ["--vm", json.dumps(vm)]
    code, text = run(*args)
    assert code == 0, text
    return json.loads(text)


def test_explain_names_why_each_earlier_rule_missed_and_when_the_window_opens(tmp_path: Path) -> None:
    event = {
        "EventId": "E1",
        "EventType": "Redeploy",
        "NotBefore": "Sat, 21 Nov 2026 01:20:00 GMT",
        "Resources": ["web_0"],
    }
    out = explain_json(tmp_path, event, WEB_VM)
    assert [(r["rule"], r["fits"]) for r in out["rules"]] == [
        ("db-hold", False),
        ("prod-redeploy-night", True),
    ]
    assert out["rules"][0]["misses"] == [
        {"key": "tags.role", "wanted": ["db", "sql"], "got": "web", "vm": "web_0"}
    ]
    assert out["decidedBy"] == "prod-redeploy-night" and out["outcome"] == "wait-window"
    assert (
        out["window"]["nextOpen"] == "2026-11-21T01:00:00.000Z"
        and out["window"]["opensAfterNotBefore"] is False
    )


def test_explain_says_when_the_window_opens_after_not_before(tmp_path: Path) -> None:
    event = {
        "EventId": "E2",
        "EventType": "Redeploy",
        "NotBefore": "2026-11-21T00:58:00Z",
        "Resources": ["web_0"],
    }
    out = explain_json(tmp_path, event, WEB_VM)
    assert out["outcome"] == "starts-at-notbefore" and out["window"]["opensAfterNotBefore"] is True
    assert "after NotBefore 2026-11-21T00:58:00.000Z" in out["reason"] and out["messageAction"] is None


def test_explain_falls_through_to_the_defaults_and_lists_budgets_unevaluated(tmp_path: Path) -> None:
    event = {
        "EventType": "Reboot",
        "NotBefore": "2026-11-21T01:10:00Z",
    }  # Resources default to the --vm names
    out = explain_json(tmp_path, event, WEB_VM)
    assert [r["rule"] for r in out["rules"]] == [
        "db-hold",
        "prod-redeploy-night",
        "default:user-initiated",
        "default:short-freeze",
        "default:impactful",
    ]
    assert out["rules"][1]["misses"][0] == {"key": "eventTypes", "wanted": ["Redeploy"], "got": "Reboot"}
    assert out["rules"][-1]["origin"] == "default"
    assert out["outcome"] == "approve-after-hook" and out["messageAction"] == "hook-then-approve"
    assert out["budgets"] == [{"budget": "per-ss", "group": "per-ss:web", "groupSize": 1, "limit": 1}]
    assert out["fleetEvaluated"] is False and "budgets not evaluated" in out["reason"]


def test_explain_hold_unknown_vm_and_passed_not_before(tmp_path: Path) -> None:
    db = {"name": "db0", "tags": {"role": "sql"}}
    held = explain_json(
        tmp_path,
        {
            "EventType": "Freeze",
            "DurationInSeconds": 5,
            "NotBefore": "2026-11-21T01:10:00Z",
            "Resources": ["db0", "ghost"],
        },
        db,
    )
    assert (
        held["outcome"] == "hold" and held["decidedBy"] == "db-hold" and held["unknownResources"] == ["ghost"]
    )
    late = explain_json(tmp_path, {"EventType": "Reboot", "NotBefore": "2026-11-21T00:50:00Z"}, WEB_VM)
    assert late["outcome"] == "starts-at-notbefore" and "has passed" in late["reason"]


def test_explain_text_output(tmp_path: Path) -> None:
    code, text = run(
        "explain",
        write(tmp_path, POLICY),
        "--now",
        NOW,
        "--vm",
        json.dumps(WEB_VM),
        "--event",
        '{"EventType": "Redeploy", "NotBefore": "2026-11-21T01:20:00Z"}',
    )
    assert code == 0
    assert '#0  db-hold (policy): no: tags.role wants ["db", "sql"], web_0 has "web"' in text
    assert "decided by prod-redeploy-night: approve-in-window" in text
    assert "outcome: wait-window: rule prod-redeploy-night: waiting for window night" in text


def test_explain_on_an_invalid_policy_exits_2(tmp_path: Path) -> None:
    code, text = run("explain", write(tmp_path, {"version": 2}), "--event", '{"EventType": "Reboot"}')
    assert code == 2 and "/version" in text


def test_explain_with_fleet_state_waits_for_a_budget() -> None:
    """The seam the decide code and whatif use: the same pure explain() with the fleet given."""
    p = policy.load(json.dumps(POLICY))
    vms = [vm_from_json({"vmId": f"id-{i}", "name": f"web_{i}", "vmScaleSetName": "web"}) for i in range(4)]
    event = event_from_json(
        {"EventType": "Reboot", "NotBefore": "2026-11-21T01:10:00Z", "Resources": ["web_0"]}
    )
    now = datetime(2026, 11, 21, 0, 55, tzinfo=timezone.utc)
    free = explain(p, event, vms, now, FleetState(vms, [vms[1]]))
    assert free.outcome == "approve-after-hook" and free.fleet_evaluated
    busy = explain(p, event, vms, now, FleetState(vms, [vms[1], vms[2]]))
    assert busy.outcome == "wait-budget" and busy.budget_block is not None and busy.budget_block.limit == 2


def test_console_script_is_installed_and_ships_apart_from_the_vm_wheel(tmp_path: Path) -> None:
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    ops = tomllib.loads((REPO / "ops" / "pyproject.toml").read_text())
    assert "se-policy" not in root["project"]["scripts"]
    assert not any(p.split(".")[0] == "central" for p in root["tool"]["setuptools"]["packages"])
    assert ops["project"]["scripts"]["se-policy"] == "central.cli.se_policy:main"
    script = Path(sys.executable).parent / "se-policy"
    assert script.exists(), "se-policy is not installed in this venv: make bootstrap installs ops/"
    bad = write(tmp_path, {"version": 1, "rules": [{"name": "a", "action": "yolo"}]})
    done = subprocess.run(
        [str(script), "check", bad], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2 and "/rules/0/action" in done.stdout
