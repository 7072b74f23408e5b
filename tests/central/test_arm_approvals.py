"""Issue 23, point 3 wired: central approves through ARM (agentless VMs, failover run out, an operator's
choice), on a real CentralService over Azurite, calling the IMDS simulator's ARM stand-in over real HTTP
with a managed-identity token from the simulator (azure-identity's ManagedIdentityCredential). The fabric
is the judge: an ARM approval starts the event there as a VM's IMDS POST does.

Exactly one effective approval per event: two instances racing, an instance dying between recording the
path and calling ARM, or after the call and before recording the answer, a late VM result against an ARM
attempt: one start in the fabric, one approval in central's record."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta
from typing import Any, Dict, Iterator, List

import pytest

from central.intake import platform
from central.runtime.service import CentralService
from central.store.tables import get_json
from sandbox import processes
from sandbox.imds.client import ImdsSimulator
from sandbox.imds.identity import DEFAULT_RESOURCE_GROUP as RG
from sandbox.imds.identity import DEFAULT_SUBSCRIPTION as SUB

from .conftest import Env, Hook
from .factory import T0, Vm, at_once, body, event, rfc1123

S = timedelta(seconds=1)
UNI = json.dumps({"name": "uni_0", "vmScaleSetName": "uni"})


@pytest.fixture(scope="module")
def imds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    vms = ["--vm", "web_0", "--vm", "web_1", "--vm", "lone_0", "--vm", "lone_1", "--vm", UNI]
    server = processes.start_imds([*vms, "--rate-limit", "0"], log_dir=tmp_path_factory.mktemp("imds-arm"))
    yield server
    server.stop()


@pytest.fixture
def sim(imds: processes.Server) -> Iterator[ImdsSimulator]:
    client = ImdsSimulator(f"http://127.0.0.1:{imds.port}")
    yield client
    client.admin("POST", "/arm", json={"throttle": 0})
    client.close()


@pytest.fixture
def arm_env(env: Env, imds: processes.Server, monkeypatch: pytest.MonkeyPatch) -> Env:
    """ARM_ENDPOINT points at the stand-in; central's identity's tokens come from the simulator."""
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://127.0.0.1:{imds.port}")
    base = env.settings

    def settings(**extra: str) -> Dict[str, str]:
        return base(ARM_ENDPOINT=f"http://127.0.0.1:{imds.port}",
                    ApprovalStorage__credential="managedidentity", **extra)

    env.settings = settings  # type: ignore[method-assign]
    return env


class AzureVm(Vm):
    """A forwarder's VM whose resourceId is a real Compute id in the simulator's subscription."""

    def identity(self) -> Dict[str, Any]:
        out = super().identity()
        out["resourceId"] = (f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/"
                             f"virtualMachines/{self.name}")
        return out


def new_id() -> str:
    return str(uuid.uuid4())


def grid(event_id: str, resources: List[str], kind: str = "virtualMachines", owner: str = "",
         status: str = "Scheduled", event_type: str = "Reboot") -> bytes:
    """One ScheduledEventEmitted event as the system topic delivers it (owner under the simulator's ids)."""
    rid = (f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/{kind}/"
           f"{owner or resources[0]}/providers/Microsoft.Maintenance/scheduledevents/{event_id}")
    nb = "" if status != "Scheduled" else rfc1123(T0 + 15 * 60 * S)
    return json.dumps([{
        "id": new_id(), "topic": f"/subscriptions/{SUB}", "subject": rid, "eventType": platform.EMITTED,
        "eventTime": T0.isoformat(), "dataVersion": "3.0", "metadataVersion": "1",
        "data": {"resourceInfo": {"id": rid, "name": event_id,
                                  "type": "microsoft.maintenance/scheduledEvents",
                                  "properties": {"EventId": event_id, "EventStatus": status,
                                                 "EventType": event_type, "EventSource": "Platform",
                                                 "Resources": resources, "NotBefore": nb,
                                                 "DurationInSeconds": -1, "Description": "maintenance",
                                                 "ResourceType": "VirtualMachine"}}}}]).encode()


def fabric_event(sim: ImdsSimulator, resources: List[str], event_type: str = "Reboot") -> str:
    return str(sim.add_event(eventType=event_type, resources=resources, eventId=new_id())["eventId"])


def arm_calls(sim: ImdsSimulator, event_id: str) -> int:
    """How many ARM calls reached the stand-in for this event (throttled ones are not recorded)."""
    return sum(1 for c in sim.admin("GET", "/arm")["calls"] if event_id in c["ids"])


def approvals(svc: CentralService, event_id: str) -> List[Dict[str, Any]]:
    return list(svc.event(event_id)["approvals"])


def row(env: Env, event_id: str) -> Dict[str, Any]:
    return next(r for r in env.rows("Events") if r.get("EventId") == event_id)


# ---- (a) agentless ---------------------------------------------------------------------------------------

def test_an_agentless_vm_s_event_is_approved_through_arm_at_its_owner(arm_env: Env, hook: Hook,
                                                                      sim: ImdsSimulator) -> None:
    event_id = fabric_event(sim, ["lone_0"])
    svc = arm_env.service()
    result = svc.handle_platform_batch([grid(event_id, ["lone_0"])], now=T0)
    assert result.approvals_sent == 1 and not result.errors, result.errors
    (attempt,) = approvals(svc, event_id)
    assert (attempt["via"], attempt["vmName"], attempt["result"]) == (
        "arm", "arm:virtualMachines/lone_0", "approved")
    view = svc.event(event_id)
    assert view["state"] == "approved"
    reason = view["decision"]["reason"]
    assert "through ARM at virtualMachines/lone_0" in reason and "agentless" in reason
    assert "no pre-approve hook runs" in reason  # the default policy drains a Reboot first: ARM cannot
    fabric = sim.event(event_id)
    assert fabric["state"] == "Started" and fabric["approvedBy"] == ["lone_0"]
    assert arm_calls(sim, event_id) == 1
    results = [r for r in arm_env.rows("Decisions")
               if r.get("EventId") == event_id and r["Action"] == "result"]
    assert [(r["State"], r["LeaderVmName"]) for r in results] == [("approved", "arm:virtualMachines/lone_0")]
    assert svc.reevaluate(now=T0 + 200 * S) == []  # approved: nothing more, ever


def test_a_scale_set_s_instance_is_acknowledged_at_the_scale_set(arm_env: Env, hook: Hook,
                                                                 sim: ImdsSimulator) -> None:
    event_id = fabric_event(sim, ["uni_0"], "Freeze")
    svc = arm_env.service()
    svc.handle_platform_batch(
        [grid(event_id, ["uni_0"], "virtualMachineScaleSets", "uni", event_type="Freeze")], now=T0)
    assert approvals(svc, event_id)[0]["vmName"] == "arm:virtualMachineScaleSets/uni"
    assert sim.event(event_id)["state"] == "Started"


def test_a_policy_rule_on_tags_never_fits_an_agentless_vm_but_one_on_its_resource_group_does(
        arm_env: Env, hook: Hook, sim: ImdsSimulator) -> None:
    policy = {"version": 1, "rules": [
        {"name": "web-by-tag", "match": {"tags": {"role": "web"}}, "action": "hold"},
        {"name": "sandbox-group", "match": {"resourceGroups": [RG]}, "action": "approve"}]}
    event_id = fabric_event(sim, ["lone_1"])
    svc = arm_env.service(POLICY_JSON=json.dumps(policy))
    svc.handle_platform_batch([grid(event_id, ["lone_1"])], now=T0)
    view = svc.event(event_id)
    assert view["decision"]["rule"] == "sandbox-group" and view["state"] == "approved"
    assert "no pre-approve hook" not in view["decision"]["reason"]  # plain approve: nothing was skipped


# ---- (b) failover ----------------------------------------------------------------------------------------

def test_when_the_failover_among_named_vms_runs_out_arm_approves(arm_env: Env, hook: Hook,
                                                                  sim: ImdsSimulator) -> None:
    """A single-VM event, its forwarder silent after reporting it: the queue attempt expires unanswered,
    no other VM can carry it, so ARM approves at the VM (owner from its own identity: no platform feed)."""
    event_id = fabric_event(sim, ["web_0"])
    svc = arm_env.service(APPROVAL_RESULT_TIMEOUT_SECONDS="60", APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS="60")
    web = AzureVm("web_0")
    svc.handle_batch([body(web.heartbeat()), body(web.incarnation_env([event(event_id, ["web_0"])]))], now=T0)
    assert len(arm_env.messages(web.vm_id)) == 1 and arm_calls(sim, event_id) == 0
    assert svc.reevaluate(now=T0 + 30 * S) == []  # the VM still has time
    decisions = svc.reevaluate(now=T0 + 61 * S)
    assert [(d.action, d.leader_vm_name) for d in decisions] == [("failover", "arm:virtualMachines/web_0")]
    assert [(a.get("via", "queue"), a["result"]) for a in approvals(svc, event_id)] == [
        ("queue", "timeout"), ("arm", "approved")]
    assert sim.event(event_id)["state"] == "Started" and arm_calls(sim, event_id) == 1
    assert len(arm_env.messages(web.vm_id)) == 1  # no second queue message
    # the VM's forwarder comes back and reports that it approved late after all: recorded, nothing more sent
    svc.handle_batch([body(web.result(event_id, "approved", approvals(svc, event_id)[0]["messageId"]))],
                     now=T0 + 70 * S)
    assert svc.reevaluate(now=T0 + 200 * S) == [] and arm_calls(sim, event_id) == 1
    assert svc.event(event_id)["state"] == "approved"


def test_a_vm_never_speaks_for_another_s_arm_approval(arm_env: Env, hook: Hook, sim: ImdsSimulator) -> None:
    """web_1 reports an event naming web_0 too, then no forwarder is live: without the platform feed, two
    standalone VMs have no one owner to acknowledge at (web_1 cannot make central approve at web_0): no ARM
    path, the event is left to NotBefore with the no-leader alert, as before."""
    event_id = fabric_event(sim, ["web_0", "web_1"])
    svc = arm_env.service(LEADER_LIVENESS_SECONDS="60", APPROVAL_RESULT_TIMEOUT_SECONDS="60",
                          APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS="60")
    web0, web1 = AzureVm("web_0"), AzureVm("web_1")
    svc.handle_batch([body(web0.heartbeat(at=T0 - 600 * S)), body(web1.heartbeat(at=T0 - 600 * S))],
                     now=T0 - 600 * S)
    svc.handle_batch([body(web1.incarnation_env([event(event_id, ["web_0", "web_1"])], at=T0 - 300 * S))],
                     now=T0, enqueued_times=[T0 - 300 * S])
    # read 300 s late, web_1 is live as of that backlog (central.runtime.intake_lag) and gets the attempt;
    # unanswered past its timeout, with both silent since, the failover has run out
    assert [a["vmName"] for a in approvals(svc, event_id)] == ["web_1"]
    svc.reevaluate(now=T0 + 200 * S)
    assert svc.event(event_id)["state"] == "no-leader"  # and no ARM path: the old answer stands
    assert arm_calls(sim, event_id) == 0


# ---- (c) operator ----------------------------------------------------------------------------------------

def test_an_operator_approves_through_arm_only_when_no_other_attempt_is_outstanding(
        arm_env: Env, hook: Hook, sim: ImdsSimulator) -> None:
    event_id = fabric_event(sim, ["web_1"])
    hold = {"version": 1, "rules": [{"name": "all", "match": {}, "action": "approve"}]}
    svc = arm_env.service(POLICY_JSON=json.dumps(hold))
    web = AzureVm("web_1")
    svc.handle_batch([body(web.heartbeat()), body(web.incarnation_env([event(event_id, ["web_1"])]))], now=T0)
    assert len(approvals(svc, event_id)) == 1  # the policy's queue attempt is out
    svc.decide(event_id, "approve", "olga", "now please", now=T0 + 5 * S, via="arm")
    assert len(approvals(svc, event_id)) == 1 and arm_calls(sim, event_id) == 0  # one attempt at a time
    view = svc.decide(event_id, "approve", "olga", "still nothing", now=T0 + 121 * S, via="arm")
    assert [(a.get("via", "queue"), a["result"], a["decidedBy"]) for a in view["approvals"]] == [
        ("queue", "timeout", "policy:all"), ("arm", "approved", "operator:olga")]
    assert sim.event(event_id)["state"] == "Started" and arm_calls(sim, event_id) == 1
    assert any(a.get("kind") == "operator-decision" and a["eventId"] == event_id for a in hook.alerts())


def test_via_arm_is_refused_with_a_hook_or_without_an_owner(arm_env: Env, hook: Hook) -> None:
    svc = arm_env.service()
    vm = Vm("plain")  # its resourceId is not a Compute id: no owner known
    svc.handle_batch([body(vm.heartbeat()), body(vm.incarnation_env([event("E-noowner", ["plain"])]))],
                     now=T0)
    with pytest.raises(ValueError, match="ARM runs no hook"):
        svc.decide("E-noowner", "approve", "olga", "x", now=T0 + S, hook=True, via="arm")
    with pytest.raises(ValueError, match="owning resource is not known"):
        svc.decide("E-noowner", "approve", "olga", "x", now=T0 + 200 * S, via="arm")


# ---- ARM's answers ---------------------------------------------------------------------------------------

def test_arm_refusing_fails_the_approval_with_one_critical_alert(arm_env: Env, hook: Hook,
                                                                 sim: ImdsSimulator) -> None:
    event_id = fabric_event(sim, ["uni_0"], "Freeze")
    svc = arm_env.service()
    # the platform named the instance itself as owner: ARM answers 404 (only the scale set owns it)
    svc.handle_platform_batch([grid(event_id, ["uni_0"], event_type="Freeze")], now=T0)
    view = svc.event(event_id)
    assert view["state"] == "approval-failed" and view["approvals"][0]["result"] == "arm-NotFound"
    alerts = [a for a in hook.alerts() if a.get("kind") == "arm-refused"]
    assert len(alerts) == 1 and alerts[0]["severity"] == "critical"
    assert svc.reevaluate(now=T0 + 60 * S) == [] and arm_calls(sim, event_id) == 1
    assert sim.event(event_id)["state"] == "Scheduled"


def test_without_the_role_arm_refuses_once_and_the_forwarder_carries_the_next_attempt(
        arm_env: Env, hook: Hook, sim: ImdsSimulator) -> None:
    """Where only the agent exists (no platform feed: nothing grants central's identity Scheduled Events
    Contributor), ARM answers 403. One critical alert; ARM is not asked again; the next attempt goes to the
    live VM's forwarder once more (a lost message), instead of approval-failed for the rest of the event."""
    event_id = fabric_event(sim, ["web_0"])
    quick = {"APPROVAL_RESULT_TIMEOUT_SECONDS": "60", "APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS": "60"}
    svc = arm_env.service(**quick)
    web = AzureVm("web_0")
    sim.admin("POST", "/arm", json={"denied": True})
    try:
        svc.handle_batch([body(web.heartbeat()), body(web.incarnation_env([event(event_id, ["web_0"])]))],
                         now=T0)
        svc.handle_batch([body(web.heartbeat(at=T0 + 50 * S))], now=T0 + 50 * S)  # alive, message lost
        svc.reevaluate(now=T0 + 61 * S)  # the attempt expired: ARM, refused
        assert [(a.get("via", "queue"), a["result"]) for a in approvals(svc, event_id)] == [
            ("queue", "timeout"), ("arm", "arm-AuthorizationFailed")]
        assert svc.event(event_id)["state"] == "approving"
        refused = [a for a in hook.alerts() if a.get("kind") == "arm-refused"]
        assert len(refused) == 1 and "Scheduled Events Contributor" in refused[0]["text"]
        decisions = svc.reevaluate(now=T0 + 62 * S)
        assert [(d.action, d.leader_vm_name) for d in decisions] == [("failover", "web_0")]
        assert len(arm_env.messages(web.vm_id)) == 2 and arm_calls(sim, event_id) == 1
        second = approvals(svc, event_id)[-1]["messageId"]
        svc.handle_batch([body(web.result(event_id, "approved", second, at=T0 + 70 * S))], now=T0 + 70 * S)
        assert svc.event(event_id)["state"] == "approved"
        svc.reevaluate(now=T0 + 200 * S)
        assert arm_calls(sim, event_id) == 1 and len(refused) == 1
    finally:
        sim.admin("POST", "/arm", json={"denied": False})


def test_throttling_beyond_the_wait_is_retried_by_the_timer(arm_env: Env, hook: Hook,
                                                            sim: ImdsSimulator) -> None:
    event_id = fabric_event(sim, ["lone_0"])
    svc = arm_env.service()
    sim.admin("POST", "/arm", json={"throttle": 1, "retryAfter": 45})  # longer than the client waits
    result = svc.handle_platform_batch([grid(event_id, ["lone_0"])], now=T0)
    (attempt,) = approvals(svc, event_id)
    assert result.approvals_sent == 0 and (attempt["sent"], attempt["result"]) == (False, None)  # not failed
    assert sim.event(event_id)["state"] == "Scheduled"
    assert svc.reevaluate(now=T0 + 40 * S) == [] and arm_calls(sim, event_id) == 0  # Retry-After: 45 s
    assert svc.reevaluate(now=T0 + 46 * S) == []  # the very attempt is made again: no new decision
    assert [(a["attempt"], a["result"]) for a in approvals(svc, event_id)] == [(1, "approved")]
    assert svc.event(event_id)["state"] == "approved" and sim.event(event_id)["state"] == "Started"
    unavailable = [a for a in hook.alerts() if a.get("kind") == "arm-unavailable"]
    assert [(a["eventId"], a["severity"]) for a in unavailable] == [(event_id, "warning")]  # said once


# ---- exactly one effective approval ----------------------------------------------------------------------

def test_two_instances_racing_make_one_arm_call(arm_env: Env, hook: Hook, sim: ImdsSimulator) -> None:
    event_id = fabric_event(sim, ["lone_1"])
    first, second = arm_env.service(), arm_env.service()
    message = grid(event_id, ["lone_1"])
    first.state.ensure_loaded(), second.state.ensure_loaded()  # both read the State table before the event
    at_once(lambda: first.handle_platform_batch([message], now=T0),
            lambda: second.handle_platform_batch([message], now=T0))
    assert arm_calls(sim, event_id) == 1
    rec = row(arm_env, event_id)
    assert [a["result"] for a in get_json(rec, "Approvals", [])] == ["approved"]
    # a stale third instance redelivered the same platform event: nothing more
    third = arm_env.service()
    third.handle_platform_batch([message], now=T0 + S)
    assert arm_calls(sim, event_id) == 1 and sim.event(event_id)["approvedBy"] == ["lone_1"]


def test_another_instance_never_calls_while_the_recorded_call_is_under_way(arm_env: Env, hook: Hook,
                                                                          sim: ImdsSimulator) -> None:
    """Instance A recorded the ARM path and is calling ARM (held inside the call); B's timer decides the same
    event meanwhile: it finds the attempt outstanding under A's lease and neither decides nor calls."""
    event_id = fabric_event(sim, ["lone_0"])
    first, second = arm_env.service(), arm_env.service()
    assert first.actor.arm is not None
    inside, release = threading.Event(), threading.Event()
    real = first.actor.arm.call

    def held(items: Any) -> Any:
        inside.set()
        release.wait(30)
        return real(items)

    first.actor.arm.call = held  # type: ignore[method-assign]
    thread = threading.Thread(target=first.handle_platform_batch, args=([grid(event_id, ["lone_0"])],),
                              kwargs={"now": T0})
    thread.start()
    try:
        assert inside.wait(30), "A never reached the ARM call"
        assert second.reevaluate(now=T0 + S) == []  # B: the attempt is A's to carry out
        assert arm_calls(sim, event_id) == 0
    finally:
        release.set()
        thread.join(timeout=60)
    assert arm_calls(sim, event_id) == 1 and sim.event(event_id)["approvedBy"] == ["lone_0"]
    assert [(a["attempt"], a["result"]) for a in approvals(second, event_id)] == [(1, "approved")]


def test_an_instance_dying_between_recording_the_path_and_calling_arm(arm_env: Env, hook: Hook,
                                                                       sim: ImdsSimulator) -> None:
    event_id = fabric_event(sim, ["lone_0"])
    dying, other = arm_env.service(), arm_env.service()
    dying.actor._send = lambda *a, **k: None  # type: ignore[method-assign] # dies after the commit
    dying.handle_platform_batch([grid(event_id, ["lone_0"])], now=T0)
    (attempt,) = get_json(row(arm_env, event_id), "Approvals", [])
    assert (attempt["via"], attempt["sent"], attempt["result"]) == ("arm", False, None)  # the path, recorded
    assert arm_calls(sim, event_id) == 0 and sim.event(event_id)["state"] == "Scheduled"
    assert other.reevaluate(now=T0 + 10 * S) == []  # its send lease still holds: nobody else calls
    assert arm_calls(sim, event_id) == 0
    other.reevaluate(now=T0 + 31 * S)  # lapsed: the other instance takes it over and makes the very call
    assert arm_calls(sim, event_id) == 1 and sim.event(event_id)["state"] == "Started"
    assert [(a["attempt"], a["result"]) for a in approvals(other, event_id)] == [(1, "approved")]


def test_an_instance_dying_after_the_call_before_recording_the_answer(arm_env: Env, hook: Hook,
                                                                       sim: ImdsSimulator) -> None:
    event_id = fabric_event(sim, ["lone_1"])
    dying, other = arm_env.service(), arm_env.service()
    assert dying.actor.arm is not None
    real = dying.actor.arm.call

    def call_then_die(items: Any) -> Any:
        real(items)
        raise RuntimeError("the instance died after ARM answered")

    dying.actor.arm.call = call_then_die  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        dying.handle_platform_batch([grid(event_id, ["lone_1"])], now=T0)
    started = sim.event(event_id)["startedAt"]
    assert started and arm_calls(sim, event_id) == 1
    other.reevaluate(now=T0 + 31 * S)  # the unsettled attempt is made again: a no-op for the fabric
    assert arm_calls(sim, event_id) == 2 and sim.event(event_id)["startedAt"] == started
    assert [(a["attempt"], a["result"]) for a in approvals(other, event_id)] == [(1, "approved")]
    assert other.reevaluate(now=T0 + 100 * S) == [] and arm_calls(sim, event_id) == 2


def test_a_late_vm_approval_stops_an_arm_call_not_yet_made(arm_env: Env, hook: Hook,
                                                            sim: ImdsSimulator) -> None:
    """The VM's approval result arrives after the ARM attempt was recorded but before anyone called ARM
    (its instance died): the ARM attempt is revoked, never called."""
    event_id = fabric_event(sim, ["web_0"])
    quick = {"APPROVAL_RESULT_TIMEOUT_SECONDS": "60", "APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS": "60"}
    dying, other = arm_env.service(**quick), arm_env.service(**quick)
    web = AzureVm("web_0")
    dying.handle_batch([body(web.heartbeat()), body(web.incarnation_env([event(event_id, ["web_0"])]))],
                       now=T0)
    first = approvals(dying, event_id)[0]["messageId"]
    dying.actor._send = lambda *a, **k: None  # type: ignore[method-assign]
    dying.reevaluate(now=T0 + 61 * S)  # failover to ARM recorded, then the instance died
    assert [a.get("via", "queue") for a in approvals(dying, event_id)] == ["queue", "arm"]
    other.handle_batch([body(web.result(event_id, "approved", first, at=T0 + 65 * S))], now=T0 + 65 * S)
    other.reevaluate(now=T0 + 95 * S)
    view = other.event(event_id)
    assert [(a.get("via", "queue"), a["result"], a.get("revoked", False)) for a in view["approvals"]] == [
        ("queue", "approved", False), ("arm", None, True)]
    assert arm_calls(sim, event_id) == 0 and view["state"] == "approved"


def test_arm_settings_are_checked_with_one_actionable_line(env: Env) -> None:
    from central.runtime.settings import CentralSettings, SettingsError

    for bad in ({"ARM_ENDPOINT": "http://management.azure.com"}, {"ARM_ENDPOINT": "ftp://x"},
                {"ARM_API_VERSION": "latest"}):
        with pytest.raises(SettingsError, match=next(iter(bad))):
            CentralSettings.from_mapping(bad)
    ok = CentralSettings.from_mapping({"ARM_ENDPOINT": "https://management.usgovcloudapi.net/"})
    assert (ok.arm_endpoint, ok.arm_api_version) == ("https://management.usgovcloudapi.net", "2025-11-01")



def test_the_owner_without_the_feed_is_one_the_forwarders_vouch_for() -> None:
    """Pure (central.policy.arm_route): a scale set's instances (Flexible: a VM id and vmScaleSetName;
    Uniform: the set's id) are acknowledged at the set; standalone VMs at themselves; VMs with different
    owners (an availability set: IMDS does not name it) or a VM central does not know: no owner."""
    from central.model.events import EventRecord
    from central.model.owner import Owner
    from central.model.vms import VmState
    from central.policy.arm_route import arm_owner

    base = f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute"
    flex = VmState("f1", "flex_1", f"{base}/virtualMachines/flex_1", scale_set="flex")
    uni = VmState("u1", "uni_3", f"{base}/virtualMachineScaleSets/uni/virtualMachines/3", scale_set="uni")
    a = VmState("a", "db-1", f"{base}/virtualMachines/db-1")
    b = VmState("b", "db-2", f"{base}/virtualMachines/db-2")

    def rec(names: List[str], reporters: List[VmState]) -> EventRecord:
        return EventRecord("E", T0, resources=names, reported_by={vm.name: vm.vm_id for vm in reporters})

    assert arm_owner(rec(["flex_1"], [flex]), [flex]) == Owner(SUB, RG, "virtualMachineScaleSets", "flex")
    assert arm_owner(rec(["uni_3"], [uni]), [uni]) == Owner(SUB, RG, "virtualMachineScaleSets", "uni")
    assert arm_owner(rec(["db-1"], [a]), [a]) == Owner(SUB, RG, "virtualMachines", "db-1")
    assert arm_owner(rec(["db-1", "db-2"], [a, b]), [a, b]) is None  # two owners
    assert arm_owner(rec(["db-1", "db-9"], [a]), [a]) is None  # db-9 unknown: its owner cannot be vouched for
    assert arm_owner(rec(["db-1"], []), [a]) is None  # nobody reported it themselves
    platform = rec(["db-1", "db-2"], [])
    platform.platform = {"owner": Owner(SUB, RG, "availabilitySets", "avset").to_json()}
    assert arm_owner(platform, []) == Owner(SUB, RG, "availabilitySets", "avset")  # the feed's word wins


def test_a_call_that_cannot_be_made_pauses_arm_calls_then_probes_again() -> None:
    """No token (an identity not yet assigned, a developer machine): retried, but not on every timer run."""
    from central.model.events import Approval
    from central.model.owner import Owner
    from central.runtime.arm import ArmAcknowledger
    from central.runtime.arm_approvals import ArmApprover

    class NoToken:  # azure-identity's failure, as a credential raises it
        calls = 0

        def get_token(self, *scopes: str) -> Any:
            NoToken.calls += 1
            raise RuntimeError("no managed identity here")

    now = [100.0]
    approver = ArmApprover(lambda: ArmAcknowledger(NoToken(), "http://127.0.0.1:9"), pause=60,
                           clock=lambda: now[0])
    call = {"owner": Owner(SUB, RG, "virtualMachines", "vm-1").to_json()}
    item = ("E1", Approval(1, "m", "", "arm:virtualMachines/vm-1", "", "approve", "p", T0, T0, message=call,
                           via="arm"))
    (first,) = approver.call([item]).values()
    assert (first.ok, first.status, NoToken.calls) == (False, 0, 1) and "no ARM token" in first.message
    now[0] += 59
    (second,) = approver.call([item]).values()
    assert (second.code, NoToken.calls) == ("Paused", 1)  # not probed again within the pause
    now[0] += 2
    approver.call([item])
    assert NoToken.calls == 2
