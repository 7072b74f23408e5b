"""Budget-group tags on the head's change log (issue 24, item 4; central.policy.group_tags): an instance reads
now only the changed events of the budget groups it is about to decide in, defers the others, and reads
them before any decision counts their group, on whatever path it comes (a partition that moved to it, the
platform feed). Two central instances on one Azurite, a budget of one VM per scale set."""

from __future__ import annotations

import json
from datetime import timedelta

from central.policy.group_tags import tag

from ..central.conftest import Env, Hook
from ..central.factory import T0, Vm, body, event
from ..central.test_platform_witness import grid, msg

BUDGET = {
    "version": 1,
    "budgets": {"per-scale-set": {"groupBy": "scaleSet", "maxImpacted": 1}},
    "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}],
}
S = timedelta(seconds=1)
DB = tag("per-scale-set:db")


def two_scale_sets(fleet_of):  # type: ignore[no-untyped-def]
    """Instance 0 owns scale set web's partition, instance 1 db's (the forwarder's partition key): web_0's
    event is approved on instance 0, then db_0's on instance 1, then web_1's waits on instance 0, which
    defers db_0's."""
    inst = fleet_of(2, POLICY_JSON=json.dumps(BUDGET))
    web0, web1, db0 = Vm("web_0", scale_set="web"), Vm("web_1", scale_set="web"), Vm("db_0", scale_set="db")
    inst[0].handle_batch([body(web0.heartbeat()), body(web1.heartbeat()),
                          body(web0.incarnation_env([event("E-web0", ["web_0"])]))], now=T0)
    inst[1].handle_batch([body(db0.heartbeat()),
                          body(db0.incarnation_env([event("E-db0", ["db_0"])], at=T0 + S))], now=T0 + S)
    waits = inst[0].handle_batch([body(web1.incarnation_env([event("E-web1", ["web_1"])], at=T0 + 2 * S))],
                                 now=T0 + 2 * S)
    assert [(d.event_id, d.state) for d in waits.decisions] == [("E-web1", "waiting-budget")]
    return inst, web0, db0


def test_an_instance_defers_another_groups_changes_and_decides_its_own(env: Env, hook: Hook,
                                                                      fleet_of) -> None:
    inst, web0, db0 = two_scale_sets(fleet_of)
    assert len(env.messages(db0.vm_id)) == 1 and len(env.messages(web0.vm_id)) == 1  # one in each set
    assert "E-db0" not in inst[0].state.active and inst[0].state.stale_tags() == {DB}  # deferred, unread
    # the timer decides in every group: it reads what was deferred first
    inst[0].reevaluate(now=T0 + 3 * S)
    assert inst[0].state.stale_tags() == set() and inst[0].state.active["E-db0"][0].state == "approving"


def test_a_vm_whose_partition_moved_is_decided_on_its_groups_changes(env: Env, hook: Hook, fleet_of) -> None:
    """db_1's envelopes reach instance 0 (its partition moved): the plan reads the db events instance 0
    deferred (the VM's groups come from its envelope: its row was never read here), so the budget holds."""
    inst, _, db0 = two_scale_sets(fleet_of)
    db1 = Vm("db_1", scale_set="db")
    at = T0 + 3 * S
    result = inst[0].handle_batch([body(db1.heartbeat(at=at)),
                                   body(db1.incarnation_env([event("E-db1", ["db_1"])], at=at))], now=at)
    assert [(d.event_id, d.state) for d in result.decisions] == [("E-db1", "waiting-budget")]
    assert result.stale_groups == 0  # read before planning, not found by a decision
    assert env.messages(db1.vm_id) == [] and len(env.messages(db0.vm_id)) == 1


def test_a_decision_counting_a_deferred_group_reads_it_first(env: Env, hook: Hook, fleet_of) -> None:
    """The platform feed's event for db_1 reaches instance 0, which plans it on its cache (no catch-up by
    group): the decision asks for scale set db's count, finds it deferred, reads it and decides again."""
    inst, _, db0 = two_scale_sets(fleet_of)
    db1 = Vm("db_1", scale_set="db")
    inst[1].handle_batch([body(db1.heartbeat(at=T0 + 2 * S))], now=T0 + 2 * S)  # its row, for the platform
    result = inst[0].handle_platform_batch([msg(grid("E-db1", ["db_1"]))], now=T0 + 3 * S)
    assert result.stale_groups == 1 and result.processed == 1
    assert inst[0].event("E-db1", now=T0 + 3 * S)["state"] == "waiting-budget"
    assert env.messages(db1.vm_id) == [] and len(env.messages(db0.vm_id)) == 1


def test_the_timers_pass_reads_what_was_deferred_before_deciding_every_event(env: Env, hook: Hook,
                                                                            fleet_of) -> None:
    """The timer decides every event (and its reverification of held envelopes goes through ingest, which
    may defer again): its pass reads every deferred event first, so no group is stale while it decides."""
    from central.runtime.results import BatchResult

    inst, _, _ = two_scale_sets(fleet_of)
    inst[0].reevaluate(now=T0 + 3 * S)  # holds E-db0 now
    db1 = Vm("db_1", scale_set="db")
    inst[1].handle_batch([body(db1.heartbeat(at=T0 + 4 * S)),
                          body(db1.incarnation_env([event("E-db1", ["db_1"])], at=T0 + 4 * S))],
                         now=T0 + 4 * S)
    inst[0].state.read_for_plan({}, [], True, wanted=frozenset({tag("per-scale-set:web")}))
    assert inst[0].state.stale_tags() == {DB}  # E-db1's change deferred
    inst[0].evaluator.run(None, T0 + 5 * S, BatchResult())  # the pass itself, without the refresh before it
    assert inst[0].state.stale_tags() == set() and "E-db1" in inst[0].state.active
