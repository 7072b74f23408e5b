"""Policy semantics central enforces (issue 11, item 5), on a real CentralService on Azurite: percentage
budgets take the group's size (VMs heard from within a day), and a window that opens only after NotBefore
says so in the decision (Azure starts the event at NotBefore: a policy can only let events start early)."""

from __future__ import annotations

import json
from datetime import timedelta

from central.cli.explain import OUTCOMES
from central.policy.decide import STARTS_AT_NOTBEFORE

from .conftest import Env, Hook
from .factory import T0, Vm, body, event

HALF_OF_EACH_SET = {
    "version": 1,
    "budgets": {"half": {"groupBy": "scaleSet", "maxImpactedPercent": 50}},
    "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}],
}
NIGHT_ONLY = {
    "version": 1,
    "windows": {"night": {"timeZone": "UTC", "start": "02:00", "end": "04:00"}},
    "rules": [{"name": "redeploy-at-night", "match": {"eventTypes": ["Redeploy"]},
               "action": "approve-in-window", "window": "night"}],
}


def states(svc) -> dict:
    return {p["eventId"]: p["state"] for p in svc.pending()}


def test_a_percentage_budget_lets_its_share_of_the_group_go_at_once(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=json.dumps(HALF_OF_EACH_SET))
    vms = [Vm(f"web_{i}", scale_set="web") for i in range(4)]
    svc.handle_batch([body(vm.heartbeat()) for vm in vms], now=T0)
    nb = T0 + timedelta(hours=2)
    batch = [body(vm.incarnation_env([event(f"E-{i}", [vm.name], not_before=nb)]))
             for i, vm in enumerate(vms[:3])]
    svc.handle_batch(batch, now=T0)
    assert states(svc) == {"E-0": "approving", "E-1": "approving", "E-2": "waiting-budget"}  # 50 % of 4
    (waiting,) = [p for p in svc.pending() if p["eventId"] == "E-2"]
    assert "2 VM(s) of half:web already impacted, 1 more would pass 2" in waiting["decision"]["reason"]


def test_vms_silent_for_a_day_do_not_count_in_a_group_size(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=json.dumps(HALF_OF_EACH_SET))
    vms = [Vm(f"web_{i}", scale_set="web") for i in range(4)]
    svc.handle_batch([body(vm.heartbeat()) for vm in vms], now=T0)
    day_later = T0 + timedelta(hours=25)
    live = vms[:2]  # web_2 and web_3 were deleted yesterday: the group is 2 VMs now, its limit 1
    svc.handle_batch([body(vm.heartbeat(at=day_later)) for vm in live], now=day_later)
    nb = day_later + timedelta(hours=2)
    svc.handle_batch([body(vm.incarnation_env([event(f"E-{i}", [vm.name], not_before=nb)], at=day_later))
                      for i, vm in enumerate(live)], now=day_later)
    assert states(svc) == {"E-0": "approving", "E-1": "waiting-budget"}


def test_a_window_opening_after_notbefore_says_the_policy_cannot_delay_it(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=json.dumps(NIGHT_ONLY))
    vm = Vm("vm-a")
    nb = T0 + timedelta(minutes=30)  # 12:30, the window opens at 02:00 tomorrow
    svc.handle_batch([body(vm.heartbeat()), body(vm.incarnation_env([event("E-w", ["vm-a"], "Redeploy",
                                                                          not_before=nb)]))], now=T0)
    (view,) = svc.pending()
    # one name for this case: the event view, the fleet view and `se-policy explain` (its outcome)
    assert view["state"] == "starts-at-notbefore" == STARTS_AT_NOTBEFORE and STARTS_AT_NOTBEFORE in OUTCOMES
    (row,) = [v for v in svc.fleet()["vms"] if v["name"] == "vm-a"]
    assert row["openEventStates"] == {"E-w": "starts-at-notbefore"}
    reason = view["decision"]["reason"]
    assert "after NotBefore" in reason and "a policy can only let events start early" in reason
    far = T0 + timedelta(hours=20)  # NotBefore tomorrow 09:00: the 02:00 window comes first
    svc.handle_batch([body(vm.incarnation_env([event("E-w2", ["vm-a"], "Redeploy", not_before=far)]))],
                     now=T0)
    (later,) = [p for p in svc.pending() if p["eventId"] == "E-w2"]
    assert later["decision"]["reason"].startswith("waiting for window night (next opens")
    assert later["state"] == "waiting-window"
