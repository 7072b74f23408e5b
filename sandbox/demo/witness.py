"""The demo's second act: Azure as a second witness (issue 23). Its own fleet: the simulator publishes Azure's
own Scheduled Events feed into the platform hub and serves ARM's acknowledge API; central points ARM_ENDPOINT
at it and takes its managed-identity tokens from it.

Scenes:
  w1  Reboot of vm-x, a VM with no forwarder     known only from the platform feed; the policy approves it
                                                 and central acknowledges through ARM, before NotBefore
  w2  Reboot of vm-d, whose forwarder dies       central asks vm-d (drain first); its forwarder is killed
      mid-drain                                  while the drain runs; the approval expires unanswered, no
                                                 other VM can carry it: ARM approves instead of NotBefore
  w3  Freeze of vm-e, cancelled by Azure         vm-e's forwarder is frozen (SIGSTOP) with the event still
                                                 listed in its last document; the platform's Canceled ends
                                                 the event exactly in central
  w4  a Reboot "Started" on vm-m and vm-n,       vm-m's forwarder reports an event Azure never emitted,
      made up by vm-m's forwarder                naming vm-n too; once the platform's grace passes it is
                                                 unconfirmed (alerted) and holds no budget: vm-n's real
                                                 Reboot is approved at once under a one-at-a-time budget

Checks come from the components' records: the simulator (events, ARM calls, IMDS POSTs), central's tables
and the webhook receiver.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from central.store.tables import get_json
from sandbox.demo.fleet import Fleet, FleetSettings, VmSpec
from sandbox.demo.scenario import Check, posted_ids, table_rows, webhook_alerts

CONFIRM_GRACE = 10  # PLATFORM_CONFIRM_GRACE_SECONDS in this act (300 in Azure)
RESULT_TIMEOUT = 15  # central's APPROVAL_RESULT_TIMEOUT_SECONDS in this act: a dead forwarder is noticed soon
DRAIN_SECONDS = 30.0  # the drain hook outlasts the result timeout: vm-d's forwarder dies in the middle
SCENE_TIMEOUT = 60.0

WITNESS_VMS = (
    VmSpec("vm-x", {"role": "batch"}, forwarder=False),  # agentless
    VmSpec("vm-d", {"role": "web"}),
    VmSpec("vm-e", {"role": "web"}),
    VmSpec("vm-m", {"role": "app"}),  # its forwarder makes an event up (w4)
    VmSpec("vm-n", {"role": "app"}),
)
WITNESS_POLICY: Dict[str, Any] = {
    "version": 1,
    "description": "make demo, second act: Azure as a second witness",
    "budgets": {"one-app-at-a-time": {"groupBy": "tag", "tag": "role", "maxImpacted": 1}},
    "rules": [
        {"name": "agentless-batch", "match": {"vmNames": ["vm-x"]}, "action": "approve", "budgets": []},
        {"name": "apps-one-at-a-time", "match": {"tags": {"role": "app"}}, "action": "approve",
         "budgets": ["one-app-at-a-time"]},
        {"name": "hold-freezes", "match": {"eventTypes": ["Freeze"]}, "action": "hold", "budgets": []},
        {"name": "drain-before-reboot", "match": {"eventTypes": ["Reboot"]}, "action": "approve-after-hook",
         "budgets": []},
    ],
}


def witness_settings(work: Path) -> FleetSettings:
    from sandbox.imds.identity import DEFAULT_SUBSCRIPTION

    extra = {"APPROVAL_RESULT_TIMEOUT_SECONDS": str(RESULT_TIMEOUT),
             "APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS": str(RESULT_TIMEOUT),  # (drains: seconds in this act)
             # every simulated VM is opted in to the platform feed (infra's scopes are the VMs' subscriptions
             # or resource groups)
             "PLATFORM_CONFIRM_SCOPES": f"/subscriptions/{DEFAULT_SUBSCRIPTION}",
             "PLATFORM_CONFIRM_GRACE_SECONDS": str(CONFIRM_GRACE)}
    return FleetSettings(work=work, vms=WITNESS_VMS, policy=dict(WITNESS_POLICY), hook_seconds=DRAIN_SECONDS,
                         platform_feed=True, arm=True, central_instances=1, central_extra=extra)


@dataclass
class WitnessScene:
    key: str
    title: str
    spec: Dict[str, Any]
    event_id: str = ""
    created: Dict[str, Any] = field(default_factory=dict)
    real_id: str = ""  # w4: vm-n's real Reboot, played while the made-up one is open


def scenes() -> List[WitnessScene]:
    return [
        WitnessScene("w1", "a Reboot of vm-x, which has no forwarder: approved through ARM",
                     {"eventType": "Reboot", "resources": ["vm-x"], "startedSeconds": 15}),
        WitnessScene("w2", "a Reboot of vm-d whose forwarder dies mid-drain: ARM approves after failover",
                     {"eventType": "Reboot", "resources": ["vm-d"], "startedSeconds": 15}),
        WitnessScene("w3", "a Freeze of vm-e, cancelled by Azure while vm-e's forwarder is frozen",
                     {"eventType": "Freeze", "resources": ["vm-e"], "durationInSeconds": 120}),
        WitnessScene("w4", "vm-m's forwarder makes up a Reboot of vm-m and vm-n that Azure never emitted",
                     {"eventType": "Reboot", "status": "Started", "resources": ["vm-m", "vm-n"],
                      "audience": ["vm-m"], "madeUp": True, "startedSeconds": 200}),
    ]


@dataclass
class WitnessEvidence:
    sim_events: Dict[str, Dict[str, Any]]
    posts: List[Dict[str, Any]]
    arm_calls: List[Dict[str, Any]]
    alerts: List[Dict[str, Any]]
    tables: Dict[str, List[Dict[str, Any]]]
    killed_at: Optional[float] = None  # vm-d's forwarder (w2)


def play(fleet: Fleet, plan: List[WitnessScene], say: Callable[[str], None] = print) -> Optional[float]:
    """Each scene, bounded in time. Returns when vm-d's forwarder was killed (w2)."""
    assert fleet.imds is not None
    t0, killed_at = time.time(), None
    for scene in plan:
        scene.created = fleet.imds.add_event(**scene.spec)
        scene.event_id = scene.created["eventId"]
        say(f"+{time.time() - t0:5.1f}s  scene {scene.key}: {scene.title} (EventId {scene.event_id[:8]}, "
            f"NotBefore {scene.created['notBefore']})")
        deadline = time.monotonic() + SCENE_TIMEOUT
        if scene.key == "w2":
            killed_at = _kill_mid_drain(fleet, scene, deadline, say, t0)
        if scene.key == "w3":
            _cancel_while_frozen(fleet, scene, deadline, say, t0)
        if scene.key == "w4":
            _real_event_beside_a_made_up_one(fleet, scene, deadline, say, t0)
        while time.monotonic() < deadline:
            if fleet.imds.event(scene.event_id)["state"] in ("Completed", "Cancelled") and _central_ended(
                    fleet, scene.event_id):
                break
            time.sleep(0.5)
        else:
            say(f"         scene {scene.key}: not over in time; going on (the checks will say)")
    return killed_at


def _state(fleet: Fleet, event_id: str) -> str:
    try:
        return str(fleet.central(f"events/{event_id}").get("state"))
    except Exception:  # noqa: BLE001 - not known yet
        return ""


def _central_ended(fleet: Fleet, event_id: str) -> bool:
    try:
        return fleet.central(f"events/{event_id}").get("status") in ("Completed", "Cancelled")
    except Exception:  # noqa: BLE001 - not known yet
        return False


def _kill_mid_drain(fleet: Fleet, scene: WitnessScene, deadline: float, say: Callable[[str], None],
                    t0: float) -> Optional[float]:
    """Wait for vm-d's drain hook to start (central's approval reached it), then SIGKILL its forwarder."""
    while time.monotonic() < deadline:
        if fleet.hook_record.exists() and any(scene.event_id in line and '"start"' in line
                                              for line in fleet.hook_record.read_text().splitlines()):
            fleet.forwarders["vm-d"].kill()
            say(f"+{time.time() - t0:5.1f}s  scene w2: vm-d's drain started; its forwarder killed (SIGKILL)")
            return time.time()
        time.sleep(0.1)
    return None


def _cancel_while_frozen(fleet: Fleet, scene: WitnessScene, deadline: float, say: Callable[[str], None],
                         t0: float) -> None:
    """Once central holds the Freeze (vm-e reported it), freeze vm-e's forwarder and let Azure cancel it."""
    assert fleet.imds is not None
    while time.monotonic() < deadline and _state(fleet, scene.event_id) != "held":
        time.sleep(0.3)
    os.kill(fleet.forwarders["vm-e"].pid, signal.SIGSTOP)
    try:
        fleet.imds.cancel(scene.event_id)
        say(f"+{time.time() - t0:5.1f}s  scene w3: vm-e's forwarder frozen; Azure cancels the Freeze")
        until = min(deadline, time.monotonic() + 20.0)  # central hears it from the platform feed alone
        while time.monotonic() < until and not _central_ended(fleet, scene.event_id):
            time.sleep(0.3)
    finally:
        os.kill(fleet.forwarders["vm-e"].pid, signal.SIGCONT)


def _real_event_beside_a_made_up_one(fleet: Fleet, scene: WitnessScene, deadline: float,
                                     say: Callable[[str], None], t0: float) -> None:
    """Wait until central alerts the made-up event as unconfirmed, then schedule vm-n's real Reboot and wait
    until the fabric started it."""
    assert fleet.imds is not None
    key = f"{scene.event_id}:unconfirmed"
    while time.monotonic() < deadline and not any(a["body"].get("key") == key for a in webhook_alerts(fleet)):
        time.sleep(0.5)
    say(f"+{time.time() - t0:5.1f}s  scene w4: central alerted it unconfirmed (Azure never emitted it)")
    real = fleet.imds.add_event(eventType="Reboot", resources=["vm-n"], startedSeconds=15)
    scene.real_id = real["eventId"]
    say(f"+{time.time() - t0:5.1f}s  scene w4: a real Reboot of vm-n (EventId {scene.real_id[:8]}) while "
        "the made-up one is still open")
    while time.monotonic() < deadline and fleet.imds.event(scene.real_id)["state"] == "Scheduled":
        time.sleep(0.5)


def collect(fleet: Fleet, plan: List[WitnessScene], killed_at: Optional[float]) -> WitnessEvidence:
    assert fleet.imds is not None
    return WitnessEvidence(
        sim_events={i: fleet.imds.event(i) for s in plan for i in (s.event_id, s.real_id) if i},
        posts=[p for p in fleet.imds.requests(method="POST") if "scheduledevents" in p.get("path", "")],
        arm_calls=list(fleet.imds.admin("GET", "/arm")["calls"]),
        alerts=webhook_alerts(fleet),
        tables=table_rows(fleet.storage, ["Events", "Decisions"]),
        killed_at=killed_at,
    )


def _when(text: Any) -> Optional[datetime]:
    if not text:
        return None
    try:
        return parsedate_to_datetime(str(text))
    except (TypeError, ValueError):
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))


def check(plan: List[WitnessScene], ev: WitnessEvidence) -> List[Check]:
    out: List[Check] = []
    by_key = {s.key: s for s in plan}

    def add(key: str, what: str, ok: Any, detail: str = "") -> None:
        out.append(Check(key, what, bool(ok), "" if ok else detail))

    for key, vm in (("w1", "vm-x"), ("w2", "vm-d")):
        scene = by_key[key]
        sim = ev.sim_events.get(scene.event_id, {})
        row = next((r for r in ev.tables["Events"] if r.get("EventId") == scene.event_id), {})
        approvals = get_json(row, "Approvals", []) if row else []
        calls = [c for c in ev.arm_calls if scene.event_id in c.get("ids", [])]
        posts = [p for p in ev.posts if scene.event_id in posted_ids(p)]
        started, not_before = _when(sim.get("startedAt")), _when(scene.created.get("notBefore"))
        add(key, f"started by an approval before NotBefore, approvedBy {vm} (simulator)",
            started and not_before and started < not_before and sim.get("approvedBy") == [vm],
            f"startedAt {sim.get('startedAt')}, NotBefore {scene.created.get('notBefore')}, "
            f"approvedBy {sim.get('approvedBy')}")
        add(key, f"one ARM acknowledge, at virtualMachines/{vm}; no IMDS POST",
            [(c["kind"], c["name"]) for c in calls] == [("virtualmachines", vm)] and not posts,
            f"ARM calls {[(c['kind'], c['name']) for c in calls]}, POSTs {[p.get('vm') for p in posts]}")
        want = [("arm", "approved")] if key == "w1" else [("queue", "timeout"), ("arm", "approved")]
        got = [(a.get("via", "queue"), a.get("result")) for a in approvals]
        add(key, "central's record: " + ", then ".join(f"{v} {r}" for v, r in want), got == want,
            f"Approvals {got}")
        add(key, "central: Completed (the platform said so)", row.get("Status") == "Completed",
            f"Events row Status {row.get('Status')}")
    w2 = by_key["w2"]
    timeouts = [a for a in ev.alerts if a["body"].get("eventId") == w2.event_id
                and a["body"].get("kind") == "approval-timeout"]
    add("w2", "one approval-timeout alert naming vm-d", len(timeouts) == 1, f"{len(timeouts)} alerts")
    add("w2", "vm-d's forwarder was killed while its drain ran", ev.killed_at is not None, "never killed")
    w3 = by_key["w3"]
    row = next((r for r in ev.tables["Events"] if r.get("EventId") == w3.event_id), {})
    platform = get_json(row, "Platform", {}) if row else {}
    history = get_json(row, "History", []) if row else []
    add("w3", "central: Cancelled, as the platform said (Canceled), no approval sent",
        row.get("Status") == "Cancelled" and platform.get("said") == "Canceled"
        and not get_json(row, "Approvals", []),
        f"Status {row.get('Status')}, platform said {platform.get('said')}")
    ender = next((h for h in history if h.get("status") == "Cancelled"), {})
    add("w3", "the platform's witness ended it (vm-e's forwarder could not unlist it)",
        ender.get("witness") == "platform", f"history {history}")
    out += _check_made_up(by_key["w4"], ev)
    keys = Counter(a["body"].get("key") for a in ev.alerts)
    add("*", "no alert delivered twice", all(n == 1 for n in keys.values()),
        f"{ {k: n for k, n in keys.items() if n > 1} }")
    return out


def _check_made_up(scene: WitnessScene, ev: WitnessEvidence) -> List[Check]:
    out: List[Check] = []

    def add(what: str, ok: Any, detail: str = "") -> None:
        out.append(Check("w4", what, bool(ok), "" if ok else detail))

    made_up = next((r for r in ev.tables["Events"] if r.get("EventId") == scene.event_id), {})
    add("central recorded the made-up event from vm-m alone, no platform witness",
        made_up and not get_json(made_up, "Platform", {}) and list(get_json(made_up, "ReportedBy", {}))
        == ["vm-m"], f"row {bool(made_up)}, reported by {list(get_json(made_up, 'ReportedBy', {}) or {})}")
    unconfirmed = [a for a in ev.alerts if a["body"].get("key") == f"{scene.event_id}:unconfirmed"]
    add("one 'unconfirmed' alert for it", len(unconfirmed) == 1, f"{len(unconfirmed)} alerts")
    real = ev.sim_events.get(scene.real_id, {})
    made = ev.sim_events.get(scene.event_id, {})
    decisions = [r for r in ev.tables["Decisions"] if r.get("EventId") == scene.real_id]
    states = [r.get("State") for r in decisions if r.get("Action") != "result"]
    add("vm-n's real Reboot: approved by the budget rule, never waiting for the budget",
        scene.real_id and "waiting-budget" not in states and "approving" in states
        and real.get("approvedBy") == ["vm-n"], f"decisions {states}, approvedBy {real.get('approvedBy')}")
    started, gone = _when(real.get("startedAt")), _when(made.get("goneAt"))
    add("...while the made-up event was still open (it held no budget)",
        started is not None and gone is not None and started < gone,
        f"real started {real.get('startedAt')}, made-up gone {made.get('goneAt')}")
    return out


@dataclass
class WitnessOutcome:
    plan: List[WitnessScene]
    checks: List[Check] = field(default_factory=list)
    error: str = ""
    evidence: Optional[WitnessEvidence] = None

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.checks) and all(c.ok for c in self.checks)


def run(work: Path, say: Callable[[str], None] = print) -> WitnessOutcome:
    outcome = WitnessOutcome(plan=scenes())
    fleet = Fleet(witness_settings(work))
    try:
        say("second act, Azure as a second witness: the simulator publishes the platform feed and serves "
            "ARM's acknowledge API; vm-x has no forwarder")
        fleet.start()
        fleet.wait_until_central_knows_every_vm()
        killed_at = play(fleet, outcome.plan, say)
        outcome.evidence = collect(fleet, outcome.plan, killed_at)
        outcome.checks = check(outcome.plan, outcome.evidence)
    except Exception as exc:  # noqa: BLE001 - reported as the act's failure; the fleet is stopped below
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        fleet.stop()
    return outcome
