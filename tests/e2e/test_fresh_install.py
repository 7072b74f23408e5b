"""A fresh install is quiet and correct (issue 11): `python -m sandbox.demo --fresh-install` runs every real
process with the built-in default policy (no POLICY_JSON), forwarders on their default approval settings
and only the install's *.example hooks. A platform Reboot, a Redeploy and a 30 s Freeze are each
`default:impactful` (approve-after-hook): each must be approved once by its VM, plainly, with the result
saying no hook was installed, and no critical alert may fire.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from central.store import get_json
from sandbox import processes

RUN_TIMEOUT = 115  # the demo bounds itself well below this


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fresh")
    evidence = tmp / "evidence.json"
    proc = subprocess.run([sys.executable, "-m", "sandbox.demo", "--fresh-install",
                           "--work", str(tmp / "work"), "--evidence", str(evidence)],
                          cwd=processes.REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    doc = json.loads(evidence.read_text()) if evidence.exists() else {}
    yield {"rc": proc.returncode, "out": proc.stdout + proc.stderr, "work": tmp / "work", **doc}


def _decisions(fresh: Dict[str, Any], event_id: str) -> List[Dict[str, Any]]:
    return [r for r in fresh["evidence"]["tables"]["Decisions"] if r["EventId"] == event_id]


def test_the_fresh_install_demo_passes_every_check(fresh: Dict[str, Any]) -> None:
    assert fresh["rc"] == 0, fresh["out"][-6000:]
    assert [s["key"] for s in fresh["scenes"]] == ["f1", "f2", "f3"]
    failed = [c for c in fresh["checks"] if not c["ok"]]
    assert fresh["checks"] and not failed, failed
    assert "the built-in default policy" in fresh["out"]


def test_no_custom_hook_is_installed_only_the_examples(fresh: Dict[str, Any]) -> None:
    for vm in ("vm-a", "vm-b", "vm-c"):
        pre = Path(fresh["work"]) / vm / "hooks" / "pre-approve.d"
        assert sorted(p.name for p in pre.iterdir()) == ["50-drain.sh.example"]
    assert not (Path(fresh["work"]) / "hooks.jsonl").exists()  # nothing ran


def test_each_impactful_event_is_approved_plainly_by_the_default_rule(fresh: Dict[str, Any]) -> None:
    for scene in fresh["scenes"]:
        rows = _decisions(fresh, scene["eventId"])
        live = [r for r in rows if r["Action"] not in ("result",) and not r.get("Shadow")]
        assert {r["Rule"] for r in live if r.get("Rule")} == {"default:impactful"}, live
        results = [r for r in rows if r["Action"] == "result" and r["State"] != "completed"]  # post-event
        assert [r["State"] for r in results] == ["approved"], results
        assert "no pre-approve hook installed" in results[0]["Reason"]
        assert results[0]["DecidedBy"] == "policy:default:impactful"
        sim = fresh["evidence"]["sim_events"][scene["eventId"]]
        assert sim["approvedBy"] == [scene["approver"]] and sim["startedAt"]


def test_no_critical_alert_and_every_alert_is_a_status_change(fresh: Dict[str, Any]) -> None:
    alerts = [a["body"] for a in fresh["evidence"]["alerts"]]
    assert alerts, "the webhook received nothing: the check would pass vacuously"
    assert not [a for a in alerts if a.get("severity") == "critical"], alerts
    assert {a.get("kind") for a in alerts} == {"event-status"}, alerts  # nothing else to tell an operator
    rows = {r["EventId"]: r for r in fresh["evidence"]["tables"]["Events"]}
    assert all(len(get_json(rows[s["eventId"]], "Approvals", [])) == 1 for s in fresh["scenes"])
