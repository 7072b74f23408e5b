"""The shadow policy (POLICY_SHADOW_JSON, issue 11 item 2) on a real CentralService on Azurite: decided
beside the live policy on every decision, stored (event view, Decisions rows marked Shadow), never sent."""

from __future__ import annotations

import json
from datetime import timedelta

from .conftest import Env, Hook
from .factory import T0, Vm, body, event

APPROVE = {"version": 1, "rules": [{"name": "reboots-go", "match": {"eventTypes": ["Reboot"]},
                                    "action": "approve"}]}
HOLD = {"version": 1, "rules": [{"name": "reboots-wait", "match": {"eventTypes": ["Reboot"]},
                                 "action": "hold"}]}


def test_a_stricter_shadow_is_recorded_and_the_live_policy_acts(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=json.dumps(APPROVE), POLICY_SHADOW_JSON=json.dumps(HOLD))
    vm = Vm("vm-a")
    svc.handle_batch([body(vm.heartbeat()), body(vm.incarnation_env([event("E-s", ["vm-a"])]))], now=T0)
    assert len(env.messages(vm.vm_id)) == 1  # the live policy approved
    view = svc.event("E-s", now=T0)
    assert view["state"] == "approving" and view["decision"]["rule"] == "reboots-go"
    assert view["shadow"]["state"] == "held" and view["shadow"]["decidedBy"] == "shadow:reboots-wait"
    rows = [(d["action"], d["shadow"]) for d in view["decisions"]]
    assert sorted(rows) == [("approve", False), ("hold", True)]
    svc.reevaluate(now=T0 + timedelta(seconds=30))  # the timer: no new shadow row for the same verdict
    assert len([d for d in svc.event("E-s", now=T0)["decisions"] if d["shadow"]]) == 1
    assert svc.health(now=T0 + timedelta(seconds=30))["shadowPolicy"]["valid"] is True


def test_a_looser_shadow_never_sends_anything(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=json.dumps(HOLD), POLICY_SHADOW_JSON=json.dumps(APPROVE))
    vm = Vm("vm-a")
    svc.handle_batch([body(vm.heartbeat()), body(vm.incarnation_env([event("E-l", ["vm-a"])]))], now=T0)
    svc.reevaluate(now=T0 + timedelta(seconds=30))
    assert env.messages(vm.vm_id) == []
    view = svc.event("E-l", now=T0)
    assert view["state"] == "held" and view["approvals"] == []
    assert view["shadow"]["state"] == "approving" and view["shadow"]["wouldSend"] == "approve"
    assert view["shadow"]["leaderVmName"] == "vm-a"


def test_an_invalid_shadow_is_ignored_and_reported(env: Env, hook: Hook) -> None:
    svc = env.service(POLICY_JSON=json.dumps(APPROVE), POLICY_SHADOW_JSON='{"version": 1, "rules": [{}]}')
    vm = Vm("vm-a")
    svc.handle_batch([body(vm.heartbeat()), body(vm.incarnation_env([event("E-i", ["vm-a"])]))], now=T0)
    assert len(env.messages(vm.vm_id)) == 1 and svc.event("E-i", now=T0)["shadow"] is None
    health = svc.health(now=T0)
    assert health["shadowPolicy"]["valid"] is False and health["status"] == "ok"
