"""`se-policy whatif` (issue 11, item 1): a history recorded by a real CentralService on Azurite (the live
policy waits for budgets and a night window), replayed through a stricter and a looser policy with the
same `decide` central runs: exact counts, from the log store and from the exported envelopes alike, and the
same output twice."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from central.cli import history, whatif
from central.cli import se_policy as policy_cli
from central.policy import document as policy_mod
from central.runtime.service import CentralService

from .conftest import Env, Hook
from .factory import T0, Vm, body, event, iso

LIVE = {
    "version": 1,
    "windows": {"night": {"timeZone": "UTC", "start": "02:00", "end": "04:00"}},
    "budgets": {"per-set": {"groupBy": "scaleSet", "maxImpacted": 1}},
    "rules": [
        {"name": "redeploy-at-night", "match": {"eventTypes": ["Redeploy"]}, "action": "approve-in-window",
         "window": "night"},
        {"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"},
    ],
}
STRICTER = {"version": 1, "rules": [{"name": "change-freeze", "action": "hold"}]}
LOOSER = {"version": 1, "rules": [{"name": "everything-now", "action": "approve"}]}


class Recorder:
    """Drives central like a small fleet does and keeps every envelope it sent (the export)."""

    def __init__(self, svc: CentralService, env: Env) -> None:
        self.svc, self.env = svc, env
        self.sent: List[Tuple[Dict[str, Any], str]] = []  # (envelope, enqueued time)

    def send(self, vm: Vm, envelopes: List[Dict[str, Any]], at: Any) -> None:
        self.sent += [(e, iso(at)) for e in envelopes]
        self.svc.handle_batch([body(e) for e in envelopes], now=at)

    def acts(self, vm: Vm, event_id: str, events: List[Dict[str, Any]], at: Any) -> None:
        """The VM's forwarder: approves its message, the event starts."""
        (message,) = [m for m in self.env.messages(vm.vm_id) if m["eventId"] == event_id]
        started = [dict(e, EventStatus="Started", NotBefore="") if e["EventId"] == event_id else e
                   for e in events]
        self.send(vm, [vm.result(event_id, "approved", message["messageId"], at=at),
                       vm.incarnation_env(started, at=at)], at)


def record(env: Env) -> Recorder:
    svc = env.service(POLICY_JSON=json.dumps(LIVE))
    web0, web1 = Vm("web_0", scale_set="web"), Vm("web_1", scale_set="web")
    db0, db1 = Vm("db_0", scale_set="db"), Vm("db_1", scale_set="db")
    rec = Recorder(svc, env)
    m = timedelta(minutes=1)
    for vm in (web0, web1, db0, db1):
        rec.send(vm, [vm.heartbeat(at=T0)], T0)
    e1 = event("E1", ["web_0"], not_before=T0 + 15 * m)
    e2 = event("E2", ["web_1"], not_before=T0 + 16 * m)
    e3 = event("E3", ["db_0"], "Redeploy", not_before=T0 + 15 * 60 * m)  # 03:00 tomorrow; the window at 02:00
    e4 = event("E4", ["db_1"], source="User", not_before=T0 + 18 * m)
    rec.send(web0, [web0.incarnation_env([e1], at=T0)], T0)  # approved at once
    rec.acts(web0, "E1", [e1], T0 + timedelta(seconds=5))
    rec.send(web1, [web1.incarnation_env([e2], at=T0 + m)], T0 + m)  # waits: web_0 is impacted
    rec.send(db0, [db0.incarnation_env([e3], at=T0 + 2 * m)], T0 + 2 * m)  # waits for the night window
    rec.send(db1, [db1.incarnation_env([e4], at=T0 + 3 * m)], T0 + 3 * m)  # a user's Reboot: at once
    rec.acts(db1, "E4", [e4], T0 + 3 * m + timedelta(seconds=5))
    rec.send(web0, [web0.heartbeat(at=T0 + 10 * m), web0.incarnation_env([], at=T0 + 10 * m)], T0 + 10 * m)
    rec.send(web1, [web1.heartbeat(at=T0 + 10 * m)], T0 + 10 * m)
    svc.reevaluate(now=T0 + 10 * m + timedelta(seconds=1))  # web_0 done: E2 may go now
    rec.acts(web1, "E2", [e2], T0 + 10 * m + timedelta(seconds=5))
    rec.send(db1, [db1.incarnation_env([], at=T0 + 13 * m)], T0 + 13 * m)
    rec.send(web1, [web1.incarnation_env([], at=T0 + 20 * m)], T0 + 20 * m)
    night = T0.replace(hour=2) + timedelta(days=1)
    rec.send(db0, [db0.heartbeat(at=night)], night)
    svc.reevaluate(now=night + timedelta(seconds=1))  # the window opens: E3 goes
    rec.acts(db0, "E3", [e3], night + timedelta(seconds=5))
    rec.send(db0, [db0.incarnation_env([], at=night + 10 * m)], night + 10 * m)
    return rec


@pytest.fixture
def recorded(env: Env, hook: Hook) -> Recorder:
    return record(env)


def replayed(env: Env, policy: Dict[str, Any]) -> List[whatif.Replayed]:
    past, vms = history.from_store(env.tables, env.prefix, since=T0 - timedelta(hours=1))
    return whatif.replay(past, vms, policy_mod.load(json.dumps(policy)))


def test_the_recorded_history_is_what_central_decided(recorded: Recorder, env: Env) -> None:
    past, vms = history.from_store(env.tables, env.prefix, since=T0 - timedelta(hours=1))
    actual = {p.record.event_id: (p.approved_at - p.record.first_seen).total_seconds() for p in past}
    assert actual == {"E1": 0, "E2": 541, "E3": 14 * 3600 - 119, "E4": 0}
    assert sorted(vms) == ["db_0", "db_1", "web_0", "web_1"]


def test_the_recorded_policy_replays_to_the_same_decisions(recorded: Recorder, env: Env) -> None:
    results = replayed(env, LIVE)
    counts = whatif.summary(results)
    assert counts["same"] == 4 and counts["budgetWaits"] == 1 and counts["windowWaits"] == 1
    assert {r.event_id: r.waits for r in results} == {"E1": [], "E2": ["waiting-budget"],
                                                      "E3": ["waiting-window"], "E4": []}


def test_a_stricter_policy_holds_what_was_approved(recorded: Recorder, env: Env) -> None:
    results = replayed(env, STRICTER)
    counts = whatif.summary(results)
    assert counts["newly-held"] == 4 and counts["events"] == 4
    assert all(r.whatif_at is None and r.waits == ["held"] for r in results)


def test_a_looser_policy_approves_earlier_what_waited(recorded: Recorder, env: Env) -> None:
    results = replayed(env, LOOSER)
    counts = whatif.summary(results)
    assert (counts["earlier"], counts["same"], counts["later"], counts["newly-held"]) == (2, 2, 0, 0)
    shift = {r.event_id: r.to_json()["shiftSeconds"] for r in results}
    assert shift == {"E1": 0.0, "E2": -541.0, "E3": -(14 * 3600 - 119.0), "E4": 0.0}


def test_the_exported_envelopes_give_the_same_answer(recorded: Recorder, env: Env, tmp_path: Path) -> None:
    export = tmp_path / "envelopes.jsonl"
    export.write_text("".join(json.dumps({"body": json.dumps(e), "enqueuedTime": at}) + "\n"
                              for e, at in recorded.sent))
    with export.open() as handle:
        past, vms = history.fold(history.envelope_lines(handle))
    results = whatif.replay(past, vms, policy_mod.load(json.dumps(LOOSER)))
    counts = whatif.summary(results)
    # the export knows when each VM approved (its result), seconds after central sent the approval
    assert (counts["earlier"], counts["same"], counts["events"]) == (2, 2, 4)


def test_the_cli_prints_a_table_and_json_and_the_same_twice(
    recorded: Recorder, env: Env, tmp_path: Path
) -> None:
    candidate = tmp_path / "looser.json"
    candidate.write_text(json.dumps(LOOSER))
    argv = ["whatif", str(candidate), "--since", "7d", "--connection-string", env.conn, "--table-prefix",
            env.prefix, "--now", iso(T0 + timedelta(days=2))]
    outputs = []
    for _ in range(2):
        out = io.StringIO()
        assert policy_cli.main(argv, out=out) == 0
        outputs.append(out.getvalue())
    assert outputs[0] == outputs[1]
    assert "4 event(s) replayed" in outputs[0] and "2 approved earlier" in outputs[0]
    (line,) = [row for row in outputs[0].splitlines() if row.startswith("E2 ")]
    assert line.split()[-1] == "earlier" and "approved +9m01s" in line
    out = io.StringIO()
    assert policy_cli.main([*argv, "--json"], out=out) == 0
    doc = json.loads(out.getvalue())
    assert doc["summary"]["earlier"] == 2
    assert [e["eventId"] for e in doc["events"]] == ["E1", "E2", "E3", "E4"]


def test_bad_history_is_one_line_and_its_own_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    candidate = tmp_path / "p.json"
    candidate.write_text(json.dumps(LOOSER))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "an envelope"}\n')
    out = io.StringIO()
    assert policy_cli.main(["whatif", str(candidate), "--from", str(bad)], out=out) == 4
    assert out.getvalue().strip() == "se-policy: line 1: not an envelope (no type and data)"
    assert policy_cli.main(["whatif", str(candidate), "--since", "30d"], out=io.StringIO()) == 3
    assert "give --connection-string or --table-endpoint" in capsys.readouterr().err
    assert policy_cli.main(["whatif", str(candidate), "--since", "a month", "--connection-string", "x"],
                           out=io.StringIO()) == 3
    capsys.readouterr()
    # a bad --step is said before anything is read (the file here is not even history)
    args = ["whatif", str(candidate), "--from", str(bad), "--step", "0"]
    assert policy_cli.main(args, out=io.StringIO()) == 3
    assert "--step must be at least 1 second" in capsys.readouterr().err


def test_each_event_is_decided_at_its_first_sight_between_steps() -> None:
    """Pure: no store. Two events 30 s and 95 s after the first: each decided when first seen."""
    from central.model.events import EventRecord
    from central.model.vms import VmState

    past = []
    for i, offset in enumerate((0, 30, 95)):
        rec = EventRecord(event_id=f"P{i}", first_seen=T0 + timedelta(seconds=offset))
        rec.absorb(event(f"P{i}", [f"vm{i}"], not_before=T0 + timedelta(minutes=20)), f"id{i}", f"vm{i}",
                   rec.first_seen)
        past.append(whatif.PastEvent(rec))
    vms = {f"vm{i}": VmState(f"id{i}", f"vm{i}") for i in range(3)}
    results = whatif.replay(past, vms, policy_mod.load(json.dumps(LOOSER)))
    assert [(r.whatif_at - r.first_seen).total_seconds() for r in results] == [0, 0, 0]
    assert [r.change for r in results] == ["newly-approved"] * 3
