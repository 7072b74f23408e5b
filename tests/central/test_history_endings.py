"""Issue 23, point 4's reading error: the forwarder's end-of-event report (`completed`, or
`post-hook-failed` from its recovery step) arrives for events central never approved too. It must not make
the event "approved" in central's record, nor an approval in either replay path (`--since`: the log store;
`--from`: the exported envelopes). A history recorded by a real CentralService on Azurite:

- H1 (db_0): the live policy holds it; Azure starts it at NotBefore; db_0's recovery reports `completed`.
- H2 (web_0): approved after a hook; the pre-approve hook fails (`hook-failed`); Azure starts it at
  NotBefore; the post-event hook fails too (`post-hook-failed`).
- A1 (web_1): approved and carried out, then `completed`: the one approval.
Replaying the live policy on this history changes no decision."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from central.cli import history, whatif
from central.policy import document as policy_mod

from .conftest import Env, Hook
from .factory import T0, Vm, event, iso
from .test_whatif import Recorder

LIVE = {
    "version": 1,
    "rules": [
        {"name": "db-frozen", "match": {"eventTypes": ["Reboot"], "tags": {"role": "db"}}, "action": "hold"},
        {"name": "drain-first", "match": {"eventTypes": ["Redeploy"]}, "action": "approve-after-hook"},
        {"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"},
    ],
}
M = timedelta(minutes=1)
S = timedelta(seconds=1)


def ending(vm: Vm, event_id: str, outcome: str, at: Any) -> Dict[str, Any]:
    """The forwarder's recovery report: no messageId, decidedBy local:recovery."""
    env = vm.result(event_id, outcome, None, at=at)
    env["data"]["decidedBy"] = "local:recovery"
    return env


def started(events: List[Dict[str, Any]], event_id: str) -> List[Dict[str, Any]]:
    return [dict(e, EventStatus="Started", NotBefore="") if e["EventId"] == event_id else e for e in events]


def message(env: Env, vm: Vm, event_id: str) -> Optional[str]:
    found = [m for m in env.messages(vm.vm_id) if m["eventId"] == event_id]
    return found[0]["messageId"] if found else None


def record(env: Env) -> Recorder:
    svc = env.service(POLICY_JSON=json.dumps(LIVE))
    db0 = Vm("db_0", tags={"role": "db"})
    web0, web1 = Vm("web_0"), Vm("web_1")
    rec = Recorder(svc, env)
    for vm in (db0, web0, web1):
        rec.send(vm, [vm.heartbeat(at=T0)], T0)
    h1 = event("H1", ["db_0"], not_before=T0 + 15 * M)
    h2 = event("H2", ["web_0"], "Redeploy", not_before=T0 + 16 * M)
    a1 = event("A1", ["web_1"], not_before=T0 + 17 * M)
    rec.send(db0, [db0.incarnation_env([h1], at=T0)], T0)  # held
    rec.send(web0, [web0.incarnation_env([h2], at=T0 + S)], T0 + S)  # hook-then-approve sent
    rec.send(web1, [web1.incarnation_env([a1], at=T0 + 2 * S)], T0 + 2 * S)  # approved at once
    msg = message(env, web0, "H2")
    assert msg is not None, "the live policy sent H2's hook-then-approve"
    rec.send(web0, [web0.result("H2", "hook-failed", msg, at=T0 + 30 * S)], T0 + 30 * S)
    rec.acts(web1, "A1", [a1], T0 + 40 * S)
    rec.send(web1, [web1.incarnation_env([], at=T0 + 10 * M), ending(web1, "A1", "completed", T0 + 10 * M)],
             T0 + 10 * M)
    # Azure starts H1 and H2 at their NotBefore; later they leave IMDS and recovery reports the end
    rec.send(db0, [db0.incarnation_env(started([h1], "H1"), at=T0 + 15 * M)], T0 + 15 * M)
    rec.send(web0, [web0.incarnation_env(started([h2], "H2"), at=T0 + 16 * M)], T0 + 16 * M)
    rec.send(db0, [db0.incarnation_env([], at=T0 + 25 * M), ending(db0, "H1", "completed", T0 + 25 * M)],
             T0 + 25 * M)
    rec.send(web0, [web0.incarnation_env([], at=T0 + 26 * M),
                    ending(web0, "H2", "post-hook-failed", T0 + 26 * M)], T0 + 26 * M)
    return rec


@pytest.fixture
def recorded(env: Env, hook: Hook) -> Recorder:
    return record(env)


def test_an_end_report_is_no_approval_in_central_s_record(recorded: Recorder, env: Env) -> None:
    views = {e["eventId"]: e for e in (recorded.svc.event(i, now=T0 + 30 * M) for i in ("H1", "H2", "A1"))}
    assert views["H1"]["state"] != "approved" and views["H1"]["outcome"] is None
    assert views["H1"]["ending"]["outcome"] == "completed"
    assert views["H2"]["state"] != "approved" and views["H2"]["outcome"] == "hook-failed"
    assert views["H2"]["ending"]["outcome"] == "post-hook-failed"
    assert views["A1"]["outcome"] == "approved" and views["A1"]["ending"]["outcome"] == "completed"


def test_the_log_store_replay_reads_no_approval_from_an_end_report(recorded: Recorder, env: Env) -> None:
    past, _ = history.from_store(env.tables, env.prefix, since=T0 - timedelta(hours=1))
    approved = {p.record.event_id: p.approved_at for p in past}
    assert approved["H1"] is None and approved["H2"] is None
    assert approved["A1"] == T0 + 2 * S  # central's approval message, not the later `completed`


def test_the_envelope_replay_reads_no_approval_from_an_end_report(recorded: Recorder, tmp_path: Path) -> None:
    export = tmp_path / "envelopes.jsonl"
    export.write_text("".join(json.dumps({"body": json.dumps(e), "enqueuedTime": at}) + "\n"
                              for e, at in recorded.sent))
    with export.open() as handle:
        past, _ = history.fold(history.envelope_lines(handle))
    approved = {p.record.event_id: p.approved_at for p in past}
    assert approved["H1"] is None and approved["H2"] is None
    assert approved["A1"] == T0 + 40 * S  # the VM's `approved` result


@pytest.mark.parametrize("source", ["store", "export"])
def test_the_live_policy_replayed_on_its_own_history_changes_nothing(
    recorded: Recorder, env: Env, tmp_path: Path, source: str
) -> None:
    if source == "store":
        past, vms = history.from_store(env.tables, env.prefix, since=T0 - timedelta(hours=1))
    else:
        lines = [json.dumps({"body": json.dumps(e), "enqueuedTime": at}) for e, at in recorded.sent]
        past, vms = history.fold(history.envelope_lines(lines))
    results = whatif.replay(past, vms, policy_mod.load(json.dumps(LIVE)))
    changes = {r.event_id: r.change for r in results}
    # H2: the live policy sent its approval (after a hook) and so does the replay; the hook that failed
    # on the VM is no decision of the policy's: compared as the decision, shown as refused
    assert changes["H1"] == "not-approved" and changes["A1"] == "same"
    assert changes["H2"] == "same"
    assert {r.event_id: r.waits for r in results}["H1"] == ["held"]
    h2 = next(r for r in results if r.event_id == "H2").to_json()
    assert h2["actual"]["approvedAt"] is None and h2["actual"]["refusedOnVm"] == "hook-failed"


def test_before_the_fix_the_end_report_read_as_an_approval() -> None:
    """The fold itself, pure: the end outcomes are not approval outcomes."""
    from central.policy.decide import DONE_OUTCOMES, END_OUTCOMES

    assert not set(DONE_OUTCOMES) & set(END_OUTCOMES)
    vm = Vm("solo")
    e = event("X1", ["solo"], not_before=T0 + 15 * M)
    envs = [(vm.incarnation_env([e], at=T0), T0),
            (vm.incarnation_env(started([e], "X1"), at=T0 + 15 * M), T0 + 15 * M),
            (vm.incarnation_env([], at=T0 + 20 * M), T0 + 20 * M),
            (ending(vm, "X1", "completed", T0 + 20 * M), T0 + 20 * M)]
    (past,), _ = history.fold(envs)
    assert past.approved_at is None and past.ended_at == T0 + 20 * M
    assert iso(past.started_at) == iso(T0 + 15 * M)
