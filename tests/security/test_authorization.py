# ruff: noqa: F811 - the shared central fixtures (env, hook, webhook) are parameters here
"""Issue 14, items 1-2: one compromised VM against central. Each attack from the issue, through a real
CentralService on Azurite with sender authentication on (envelopes signed as the forwarder signs them,
tests/security/signing.py): what the attacker says is refused (quarantined and alerted) or simply not
applied, and the victim's state, budgets and alerts stay as the victim's own reports make them."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional

import pytest

from central.model.events import STALE_SCHEDULED
from central.policy.decide import REPORT_GRACE
from central.runtime.results import BatchResult
from central.runtime.service import CentralService
from sandbox.imds.signer import Signer
from tests.central.conftest import Env, Hook, env, hook, webhook  # noqa: F401 - fixtures reused
from tests.central.factory import Vm, body, event

NOW = datetime.now(timezone.utc).replace(microsecond=0)  # attested documents are made at the real time
HOLD_ALL = {"version": 1, "rules": [{"name": "manual", "action": "hold"}]}
APPROVE_REBOOTS = {"version": 1, "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]},
                                            "action": "approve"}]}
FREEZE_HELD = {"version": 1, "rules": [
    {"name": "freezes-held", "match": {"eventTypes": ["Freeze"]}, "action": "hold"},
    {"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}]}
ONE_PER_AVSET_TAG = {"version": 1,
                     "budgets": {"per-avset": {"groupBy": "tag", "tag": "avset", "maxImpacted": 1}},
                     "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}]}
ONE_PER_SCALE_SET = {"version": 1, "budgets": {"per-set": {"groupBy": "scaleSet", "maxImpacted": 1}},
                     "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}]}


class Rig:
    def __init__(self, env: Env, signer: Optional[Signer]) -> None:
        self.env = env
        self.signer = signer

    def service(self, policy: Optional[Dict[str, Any]] = None, **extra: str) -> CentralService:
        if self.signer is not None:
            extra["AUTHN_TRUST_PEM"] = self.signer.trust_pem
        return self.env.service(POLICY_JSON=json.dumps(policy) if policy else "", **extra)

    def send(self, svc: CentralService, sender: Vm, envelopes: List[Dict[str, Any]],
             now: datetime = NOW) -> BatchResult:
        """`envelopes` published by `sender`'s forwarder: signed with its key (its own vmId, whatever the
        envelopes claim)."""
        bodies = [body(e) for e in envelopes]
        props = None
        if self.signer is not None:
            props = [self.signer.properties(sender.name, sender.vm_id, b) for b in bodies]
        return svc.handle_batch(bodies, now=now, properties=props)


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer()


@pytest.fixture
def rig(env: Env, signer: Signer) -> Rig:
    return Rig(env, signer)


@pytest.fixture
def plain(env: Env) -> Rig:
    """Central in its default configuration (AUTHN_MODE=required) for attacks a VM makes as itself over
    hours: every envelope is signed by the VM it names with tests.signing's long-lived test documents
    (real ones live ~6 h). Nothing here turns authentication off (issue 22, point 8)."""
    return Rig(env, None)


def impersonating(victim: Vm) -> Vm:
    """A Vm that builds envelopes claiming the victim's vmId and name (the attacker signs them)."""
    return copy.deepcopy(victim)


def refused_alerts(hook: Hook) -> List[Dict[str, Any]]:
    return [a for a in hook.alerts() if a["kind"] in ("refused-report", "quarantined")]


# ---- with its own identity ------------------------------------------------------------------------

def test_a_vm_cannot_report_another_vms_event_as_started(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(HOLD_ALL)
    victim, attacker = Vm("vm-v"), Vm("vm-x")
    scheduled = event("E-s", ["vm-v"], not_before=NOW + timedelta(hours=1))
    rig.send(svc, victim, [victim.heartbeat(at=NOW), victim.incarnation_env([scheduled], at=NOW)])
    rig.send(svc, attacker, [attacker.incarnation_env([event("E-s", ["vm-v"], status="Started")], at=NOW)])
    view = svc.event("E-s")
    assert view["status"] == "Scheduled" and "vm-x" not in view["reportedBy"]
    # naming itself too: the facts differ from the first report -> refused, kept, alerted
    result = rig.send(svc, attacker, [attacker.incarnation_env(
        [event("E-s", ["vm-v", "vm-x"], status="Started")], at=NOW + timedelta(seconds=1))],
        now=NOW + timedelta(seconds=1))
    assert result.refused == 1 and svc.event("E-s")["status"] == "Scheduled"
    assert [a["kind"] for a in refused_alerts(hook)] == ["refused-report"]
    assert any("Resources differ" in r["Errors"] for r in env.rows("Quarantine"))
    assert not [a for a in hook.alerts() if a.get("status") == "Started"]


def test_a_result_for_an_approval_sent_to_another_vm_is_refused(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(APPROVE_REBOOTS)
    victim, attacker = Vm("vm-v"), Vm("vm-x")
    rig.send(svc, victim, [victim.heartbeat(at=NOW), victim.incarnation_env(
        [event("E-r", ["vm-v"], not_before=NOW + timedelta(hours=1))], at=NOW)])
    (message,) = env.messages(victim.vm_id)
    for message_id in (message["messageId"], None):  # the very message (guessed), and a "local" decision
        result = rig.send(svc, attacker, [attacker.result("E-r", "rejected", message_id, at=NOW)])
        assert result.refused == 1
    view = svc.event("E-r")
    assert view["state"] == "approving" and view["outcome"] is None
    assert view["approvals"][0]["result"] is None
    assert not [a for a in hook.alerts() if a["kind"] == "approval-failed"]
    # the victim's own result counts
    rig.send(svc, victim, [victim.result("E-r", "approved", message["messageId"], at=NOW)])
    assert svc.event("E-r")["outcome"] == "approved"


def test_adding_its_name_to_resources_never_makes_it_the_leader(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(HOLD_ALL)
    victim, attacker = Vm("vm-v"), Vm("vm-a")  # "vm-a" sorts first: the leader if it were named
    rig.send(svc, victim, [victim.heartbeat(at=NOW), victim.incarnation_env(
        [event("E-l", ["vm-v"], not_before=NOW + timedelta(hours=1))], at=NOW)])
    result = rig.send(svc, attacker, [attacker.heartbeat(at=NOW), attacker.incarnation_env(
        [event("E-l", ["vm-a", "vm-v"], not_before=NOW + timedelta(hours=1))], at=NOW)])
    assert result.refused == 1 and svc.event("E-l")["resources"] == ["vm-v"]
    svc.decide("E-l", "approve", "alice", "go", now=NOW + timedelta(seconds=5))
    assert len(env.messages(victim.vm_id)) == 1 and env.messages(attacker.vm_id) == []


def test_retyping_a_known_event_does_not_bypass_a_hold_rule(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(FREEZE_HELD)
    victim, attacker = Vm("vm-v"), Vm("vm-x")  # both named: the event is theirs (one availability set)
    freeze = event("E-t", ["vm-v", "vm-x"], "Freeze", not_before=NOW + timedelta(minutes=30))
    rig.send(svc, victim, [victim.heartbeat(at=NOW), victim.incarnation_env([freeze], at=NOW)])
    assert svc.event("E-t")["state"] == "held"
    reboot = dict(freeze, EventType="Reboot")
    result = rig.send(svc, attacker, [attacker.heartbeat(at=NOW), attacker.incarnation_env([reboot], at=NOW)])
    assert result.refused == 1
    svc.reevaluate(now=NOW + timedelta(seconds=10))
    view = svc.event("E-t")
    assert view["eventType"] == "Freeze" and view["state"] == "held"
    assert env.messages(victim.vm_id) == [] and env.messages(attacker.vm_id) == []


def test_a_made_up_event_naming_other_vms_holds_their_budget_only_briefly(
    plain: Rig, env: Env, hook: Hook
) -> None:
    svc = plain.service(ONE_PER_SCALE_SET)
    web0, web1 = Vm("web_0", scale_set="web"), Vm("web_1", scale_set="web")
    attacker = Vm("x_0", scale_set="x")
    for vm in (web0, web1, attacker):
        plain.send(svc, vm, [vm.heartbeat(at=NOW)])
    made_up = event("E-fake", ["x_0", "web_0"], status="Started")
    plain.send(svc, attacker, [attacker.incarnation_env([made_up], at=NOW)])
    real = event("E-real", ["web_1"], not_before=NOW + timedelta(hours=1))
    plain.send(svc, web1, [web1.incarnation_env([real], at=NOW)])
    assert svc.event("E-real")["state"] == "waiting-budget"  # web_0's own report may still be on its way
    later = NOW + REPORT_GRACE + timedelta(seconds=5)
    for vm in (web0, web1):  # both live, and web_0 never reports the made-up event
        plain.send(svc, vm, [vm.heartbeat(at=later)], now=later)
    svc.reevaluate(now=later)
    assert svc.event("E-real")["state"] == "approving" and len(env.messages(web1.vm_id)) == 1


def test_claiming_another_groups_tag_does_not_take_its_budget(plain: Rig, env: Env, hook: Hook) -> None:
    """Tags are the VM's own claim (no authoritative source is wired): a changed claim steers rules on its
    own events, but its budget groups stay those of first sight, so it cannot hold another group's."""
    svc = plain.service(ONE_PER_AVSET_TAG)
    db0 = Vm("db_0", tags={"avset": "db"})
    attacker = Vm("x_0", tags={"avset": "x"})
    for vm in (db0, attacker):
        plain.send(svc, vm, [vm.heartbeat(at=NOW)])
    attacker.tags = {"avset": "db"}  # root on x_0: its forwarder now claims db's availability set
    made_up = event("E-fake", ["x_0"], status="Started")  # about itself: counts at once, wherever it is
    plain.send(svc, attacker, [attacker.incarnation_env([made_up], at=NOW)])
    real = event("E-real", ["db_0"], not_before=NOW + timedelta(hours=1))
    plain.send(svc, db0, [db0.incarnation_env([real], at=NOW)])
    assert svc.event("E-real")["state"] == "approving" and len(env.messages(db0.vm_id)) == 1
    row = next(r for r in env.rows("Vms") if r["VmName"] == "x_0")
    assert json.loads(row["Tags"]) == {"avset": "db"} and json.loads(row["GroupTags"]) == {"avset": "x"}


def test_a_vm_first_seen_in_a_tag_group_counts_in_its_budget(plain: Rig, env: Env, hook: Hook) -> None:
    """The same budget still works (the test above can fail): db_1's own Started event holds db_0's."""
    svc = plain.service(ONE_PER_AVSET_TAG)
    db0, db1 = Vm("db_0", tags={"avset": "db"}), Vm("db_1", tags={"avset": "db"})
    for vm in (db0, db1):
        plain.send(svc, vm, [vm.heartbeat(at=NOW)])
    plain.send(svc, db1, [db1.incarnation_env([event("E-one", ["db_1"], status="Started")], at=NOW)])
    plain.send(svc, db0, [db0.incarnation_env([event("E-two", ["db_0"], not_before=NOW + timedelta(hours=1))],
                                              at=NOW)])
    assert svc.event("E-two")["state"] == "waiting-budget" and env.messages(db0.vm_id) == []


def test_a_vm_retagged_on_purpose_changes_budget_group_once_its_row_is_deleted(
        plain: Rig, env: Env, hook: Hook) -> None:
    """The operator's way to move a VM into another tag group (docs/central.md): delete its `vm:` row;
    its next envelope binds its tags of then, and it counts in its new group's budget."""
    svc = plain.service(ONE_PER_AVSET_TAG)
    db0, moved = Vm("db_0", tags={"avset": "db"}), Vm("x_0", tags={"avset": "x"})
    for vm in (db0, moved):
        plain.send(svc, vm, [vm.heartbeat(at=NOW)])
    moved.tags = {"avset": "db"}
    env.tables.get_table_client(f"{env.prefix}State").delete_entity("fleet", f"vm:{moved.vm_id}")
    plain.send(svc, moved, [moved.heartbeat(at=NOW + timedelta(seconds=1))])
    row = next(r for r in env.rows("Vms") if r["VmName"] == "x_0")
    assert json.loads(row["GroupTags"]) == {"avset": "db"}
    plain.send(svc, moved, [moved.incarnation_env([event("E-one", ["x_0"], status="Started")], at=NOW)])
    plain.send(svc, db0, [db0.incarnation_env([event("E-two", ["db_0"], not_before=NOW + timedelta(hours=1))],
                                              at=NOW)])
    assert svc.event("E-two")["state"] == "waiting-budget" and env.messages(db0.vm_id) == []


def test_made_up_events_end_and_a_vm_cannot_flood_new_events(plain: Rig, env: Env, hook: Hook) -> None:
    svc = plain.service(HOLD_ALL)
    attacker = Vm("vm-x")
    events = [event(f"E-f{i:02d}", ["vm-x"], not_before=NOW + timedelta(minutes=15)) for i in range(32)]
    plain.send(svc, attacker, [attacker.heartbeat(at=NOW), attacker.incarnation_env(events, at=NOW)])
    more = [event(f"E-g{i:02d}", ["vm-x"], not_before=NOW + timedelta(minutes=15)) for i in range(8)]
    result = plain.send(svc, attacker, [attacker.incarnation_env(events[:24] + more, at=NOW)])
    assert result.refused == 1  # 32 new events in the hour already: the 8 more are refused
    assert len(svc.pending()) == 24  # (and the 8 it stopped listing ended, as IMDS would have it)
    # the made-up events never start: an hour past NotBefore central ends them (linear, one timer run)
    after = NOW + timedelta(minutes=15) + STALE_SCHEDULED + timedelta(seconds=1)
    decisions = svc.reevaluate(now=after)
    assert len([d for d in decisions if d.action == "ended-stale"]) == 24 and svc.pending() == []
    late = plain.send(svc, attacker, [attacker.incarnation_env(events, at=after)], now=after)
    assert late.late == 32 and svc.pending() == []  # still listed: recognised as ended, never revived


def test_an_alert_flood_never_crowds_out_a_critical_alert(plain: Rig, env: Env, hook: Hook) -> None:
    svc = plain.service(HOLD_ALL)
    victim, attacker = Vm("vm-v"), Vm("vm-x")
    hook.fail_next(100_000)  # the webhook is down
    plain.send(svc, victim, [victim.heartbeat(at=NOW)])
    for i in range(60):  # 60 distinct schema-invalid IMDS answers from the attacker
        plain.send(svc, attacker, [attacker.quarantined(f"<html>{i}</html>", at=NOW)])
    plain.send(svc, victim, [victim.heartbeat(at=NOW + timedelta(seconds=1), dropped=3)],
               now=NOW + timedelta(seconds=1))
    now = NOW
    for _ in range(8):  # far more timer rounds than a non-critical alert gets
        now += timedelta(hours=1)
        svc.reevaluate(now=now)
    assert hook.alerts() == []
    hook.fail_next(0)
    svc.reevaluate(now=now + timedelta(hours=1, seconds=1))
    kinds = [a["kind"] for a in hook.alerts()]
    assert kinds.count("outbox-dropped") == 1  # the critical one is still there, and delivered
    assert len(env.rows("Quarantine")) == 60  # every body kept
    attempts = [a for a in hook.alerts() if a["kind"] == "quarantined"]
    assert len(attempts) <= 1  # one alert per source per window, given up like any non-critical one


# ---- as another VM (the victim's vmId and name are visible in Resources and queue names) ------------

def test_a_forged_empty_document_does_not_end_the_victims_event(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(HOLD_ALL)
    victim, attacker = Vm("vm-v"), Vm("vm-x")
    rig.send(svc, victim, [victim.heartbeat(at=NOW), victim.incarnation_env(
        [event("E-e", ["vm-v"], not_before=NOW + timedelta(hours=1))], at=NOW)])
    forged = impersonating(victim)
    result = rig.send(svc, attacker, [forged.incarnation_env([], at=NOW)])
    assert result.quarantined == 1 and result.processed == 0
    assert svc.event("E-e")["status"] == "Scheduled" and [p["eventId"] for p in svc.pending()] == ["E-e"]
    (row,) = [r for r in env.rows("Quarantine") if "not authenticated" in r["Errors"]]
    assert "(vmid)" in row["Errors"]


def test_unsigned_envelopes_are_refused(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(HOLD_ALL)
    victim = Vm("vm-v")
    result = svc.handle_batch([body(victim.heartbeat(at=NOW))], now=NOW)
    assert result.quarantined == 1 and env.rows("Vms") == []
    assert "(missing)" in env.rows("Quarantine")[0]["Errors"]
    assert svc.health()["senderAuthentication"]["enabled"] is True


def test_forged_heartbeats_do_not_keep_a_dead_vm_alive(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(HOLD_ALL)
    victim, attacker = Vm("vm-v"), Vm("vm-x")
    rig.send(svc, victim, [victim.heartbeat(at=NOW)])
    forged = impersonating(victim)
    for minutes in (2, 4, 6):  # the victim's own heartbeat ids were at NOW: these are new ids
        at = NOW + timedelta(minutes=minutes)
        assert rig.send(svc, attacker, [forged.heartbeat(at=at)], now=at).quarantined == 1
    (row,) = [r for r in env.rows("Vms") if r["VmId"] == victim.vm_id]
    assert row["LastSeen"].replace(tzinfo=timezone.utc) == NOW  # dead for leader election after 5 minutes


def test_forged_grouping_is_refused_whoever_signs_it(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(ONE_PER_SCALE_SET)
    victim, attacker = Vm("web_0", scale_set="web"), Vm("x_0", scale_set="x")
    rig.send(svc, victim, [victim.heartbeat(at=NOW)])
    forged = impersonating(victim)
    forged.scale_set = "db"
    at = NOW + timedelta(seconds=1)
    assert rig.send(svc, attacker, [forged.heartbeat(at=at)]).quarantined == 1  # not the victim's key
    assert rig.send(svc, victim, [forged.heartbeat(at=at)]).refused == 1  # a vmId's scale set is fixed
    (row,) = env.rows("Vms")
    assert row["ScaleSet"] == "web"


def test_a_forged_huge_incarnation_does_not_shadow_the_victims_documents(
    rig: Rig, env: Env, hook: Hook
) -> None:
    svc = rig.service(HOLD_ALL)
    victim, attacker = Vm("vm-v"), Vm("vm-x")
    rig.send(svc, victim, [victim.heartbeat(at=NOW), victim.incarnation_env([], at=NOW)])
    forged = impersonating(victim)
    forged.incarnation = 2**62
    assert rig.send(svc, attacker, [forged.incarnation_env([], at=NOW)]).quarantined == 1
    rig.send(svc, victim, [victim.incarnation_env(
        [event("E-i", ["vm-v"], not_before=NOW + timedelta(hours=1))], at=NOW)])
    assert [p["eventId"] for p in svc.pending()] == ["E-i"]


def test_a_forged_drop_counter_does_not_suppress_the_victims_drop_alert(
    rig: Rig, env: Env, hook: Hook
) -> None:
    svc = rig.service(HOLD_ALL)
    victim, attacker = Vm("vm-v"), Vm("vm-x")
    rig.send(svc, victim, [victim.heartbeat(at=NOW)])
    forged = impersonating(victim)
    at = NOW + timedelta(milliseconds=500)
    assert rig.send(svc, attacker, [forged.heartbeat(at=at, dropped=1000)], now=at).quarantined == 1
    rig.send(svc, victim, [victim.heartbeat(at=NOW + timedelta(seconds=1), dropped=3)],
             now=NOW + timedelta(seconds=1))
    drops = [a for a in hook.alerts() if a["kind"] == "outbox-dropped"]
    assert len(drops) == 1 and drops[0]["facts"]["dropped"] == 3


def test_a_second_vmid_cannot_take_over_a_live_vms_name(rig: Rig, env: Env, hook: Hook) -> None:
    svc = rig.service(HOLD_ALL)
    victim = Vm("vm-v")
    usurper = Vm("vm-v")  # its own vmId, genuinely signed, claiming the victim's name
    rig.send(svc, victim, [victim.heartbeat(at=NOW), victim.incarnation_env(
        [event("E-n", ["vm-v"], not_before=NOW + timedelta(hours=1))], at=NOW)])
    result = rig.send(svc, usurper, [usurper.heartbeat(at=NOW)])
    assert result.refused == 1 and [r["VmId"] for r in env.rows("Vms")] == [victim.vm_id]
    svc.decide("E-n", "approve", "alice", "go", now=NOW + timedelta(seconds=5))
    assert len(env.messages(victim.vm_id)) == 1 and env.messages(usurper.vm_id) == []
