"""The demo's scenario: four events played on the fleet, what every component recorded, and the checks.

Scenes (sequential, each bounded in time):
  a  user Reboot on vm-a            central approves at once (policy default:user-initiated)
  b  platform Freeze of vm-b, vm-c  one availability-set event: approved ONCE, by the leader vm-b
  c  Redeploy on vm-a               central asks hook-then-approve: vm-a drains, then POSTs
  d  Preempt on vm-c                30 s notice: the VM's fast path drains and approves on its own

`--fresh-install` plays fresh_install_scenes() instead, on a fleet as a new operator has it: no POLICY_JSON
(the built-in defaults), forwarders with their default settings and only the install's *.example hooks.

The evidence comes from the components' own records: the simulator (its events and request log),
the webhook receiver (alerts as delivered), central's log store tables, and the drain hook's record.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from azure.data.tables import TableServiceClient

from central.store.state_rows import read_table
from central.store.tables import get_json
from sandbox.demo.fleet import TABLE_PREFIX, Fleet

STARTED_SECONDS = 15.0  # simulated seconds an event stays Started before it is gone
SCENE_TIMEOUT = 30.0    # real seconds one scene may take to end


@dataclass
class Scene:
    key: str
    title: str
    spec: Dict[str, Any]         # POST /admin/events body
    approver: str                # the one VM that must POST StartRequests
    decided_by: str              # who the approval result must name
    hook_first: bool             # the drain hook ran on the approver before the POST
    central_message: Optional[str]  # action of central's one approval message, None: no message
    no_hook_installed: bool = False  # the approver had no pre-approve hook: approved plainly, and says so
    # the status alerts posted by default (STATUS_ALERT_MIN_SEVERITY warning): the Scheduled one of a rule
    # whose severity is warning; an approved start and the end are info, not posted
    alerted: Tuple[str, ...] = ("Scheduled",)
    maybe_alerted: Tuple[str, ...] = ()  # posted or not by how two envelopes race (at most once)
    event_id: str = ""
    created: Dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"[{self.key}] {self.spec['eventType']}"


def scenes() -> List[Scene]:
    s = STARTED_SECONDS
    return [
        Scene("a", "a user Reboot on vm-a, approved at once by central",
              {"eventType": "Reboot", "eventSource": "User", "resources": ["vm-a"], "startedSeconds": s},
              "vm-a", "policy:default:user-initiated", False, "approve", alerted=()),
        Scene("b", "a platform Freeze of the availability set vm-b + vm-c, approved once by the leader",
              {"eventType": "Freeze", "eventSource": "Platform", "resources": ["vm-b", "vm-c"],
               "durationInSeconds": 5, "startedSeconds": s},
              "vm-b", "policy:default:short-freeze", False, "approve", alerted=()),
        Scene("c", "a Redeploy of vm-a, held until its drain hook ran",
              {"eventType": "Redeploy", "eventSource": "Platform", "resources": ["vm-a"],
               "startedSeconds": s},
              "vm-a", "policy:drain-before-redeploy", True, "hook-then-approve"),
        Scene("d", "a Preempt of vm-c (30 s notice), handled on the VM by the fast path",
              {"eventType": "Preempt", "eventSource": "Platform", "resources": ["vm-c"], "startedSeconds": s},
              "vm-c", "vm:vm-c (local:fastpath)", True, None,
              # the start is news (warning) when it reaches central before the VM's fast-path result
              maybe_alerted=("Started",)),  # the VM's word: log_rows.result_decider
    ]


def fresh_install_scenes() -> List[Scene]:
    """The events the issue found noisy on a fresh install: each is `default:impactful`
    (approve-after-hook), the VM has no hook installed, so it approves plainly and reports that as info."""
    s = STARTED_SECONDS
    rule = "policy:default:impactful"
    return [
        Scene("f1", "a platform Reboot of vm-a, no pre-approve hook installed",
              {"eventType": "Reboot", "eventSource": "Platform", "resources": ["vm-a"], "startedSeconds": s},
              "vm-a", rule, False, "hook-then-approve", no_hook_installed=True),
        Scene("f2", "a Redeploy of vm-b, no pre-approve hook installed",
              {"eventType": "Redeploy", "eventSource": "Platform", "resources": ["vm-b"],
               "startedSeconds": s},
              "vm-b", rule, False, "hook-then-approve", no_hook_installed=True),
        Scene("f3", "a 30 s Freeze of vm-c (not a short one), no pre-approve hook installed",
              {"eventType": "Freeze", "eventSource": "Platform", "resources": ["vm-c"],
               "durationInSeconds": 30, "startedSeconds": s},
              "vm-c", rule, False, "hook-then-approve", no_hook_installed=True),
    ]


# ---- playing ---------------------------------------------------------------------------------------

def play(fleet: Fleet, plan: List[Scene], say: Callable[[str], None] = print,
         until: Optional[float] = None) -> float:
    """Schedule each scene's event and wait (bounded, also by the monotonic `until`) until the simulator
    shows it gone. Returns t0, the unix time the scenario began."""
    assert fleet.imds is not None
    t0 = time.time()
    for scene in plan:
        if until is not None and time.monotonic() > until:
            say(f"         scene {scene.key}: skipped, out of time")
            continue
        scene.created = fleet.imds.add_event(**scene.spec)
        scene.event_id = scene.created["eventId"]
        say(f"+{time.time() - t0:5.1f}s  scene {scene.key}: {scene.title} (EventId {scene.event_id[:8]}, "
            f"NotBefore {scene.created['notBefore']})")
        deadline = min(time.monotonic() + SCENE_TIMEOUT, until or float("inf"))
        while time.monotonic() < deadline:
            if fleet.imds.event(scene.event_id)["state"] in ("Completed", "Cancelled"):
                break
            dead = fleet.exited()
            if dead:
                raise RuntimeError("a process exited during the scenario: " + "; ".join(dead))
            time.sleep(0.25)
        else:
            say(f"         scene {scene.key}: not over in time; going on (the checks will say)")
    return t0


def settle(fleet: Fleet, plan: List[Scene], timeout: float = 20.0) -> None:
    """Wait (bounded) until every event's Completed alert arrived (central's last step for it)."""
    deadline = time.monotonic() + timeout
    wanted = {f"{s.event_id}:Completed" for s in plan if s.event_id}
    while time.monotonic() < deadline:
        got = {a["body"].get("key") for a in webhook_alerts(fleet)}
        if wanted <= got:
            return
        time.sleep(0.5)


# ---- evidence ---------------------------------------------------------------------------------------

@dataclass
class Evidence:
    sim_events: Dict[str, Dict[str, Any]]
    posts: List[Dict[str, Any]]          # simulator request log: POST scheduledevents
    alerts: List[Dict[str, Any]]         # webhook receiver: {path, body, at}
    hooks: List[Dict[str, Any]]          # the drain hook's own record
    tables: Dict[str, List[Dict[str, Any]]]
    instances: List[Dict[str, Any]] = field(default_factory=list)  # /api/health of each central instance

    def posts_for(self, event_id: str) -> List[Dict[str, Any]]:
        return [p for p in self.posts if event_id in posted_ids(p)]

    def event_row(self, event_id: str) -> Optional[Dict[str, Any]]:
        return next((r for r in self.tables["Events"] if r.get("EventId") == event_id), None)


def posted_ids(post: Dict[str, Any]) -> List[str]:
    try:
        body = json.loads(post.get("body") or "{}")
        return [str(i.get("EventId")) for i in body.get("StartRequests", []) if isinstance(i, dict)]
    except (ValueError, AttributeError):
        return []


def webhook_alerts(fleet: Fleet) -> List[Dict[str, Any]]:
    import requests

    session = requests.Session()
    session.trust_env = False
    resp = session.get(f"{fleet.webhook_url}/alerts", timeout=10)
    resp.raise_for_status()
    return list(resp.json())


def table_rows(connection_string: str, names: List[str]) -> Dict[str, List[Dict[str, Any]]]:
    service = TableServiceClient.from_connection_string(connection_string)
    return {name: read_table(service, TABLE_PREFIX, name) for name in names}


def collect(fleet: Fleet, plan: List[Scene]) -> Evidence:
    assert fleet.imds is not None
    hooks = []
    if fleet.hook_record.exists():
        hooks = [json.loads(line) for line in fleet.hook_record.read_text().splitlines() if line.strip()]
    return Evidence(
        sim_events={s.event_id: fleet.imds.event(s.event_id) for s in plan if s.event_id},
        posts=[p for p in fleet.imds.requests(method="POST") if "scheduledevents" in p.get("path", "")],
        alerts=webhook_alerts(fleet),
        hooks=hooks,
        tables=table_rows(fleet.storage, ["Events", "Decisions", "Incarnations", "Alerts"]),
        instances=[fleet.central("health", instance=i) for i in range(len(fleet.runner_names))],
    )


# ---- checks -----------------------------------------------------------------------------------------

@dataclass
class Check:
    scene: str
    what: str
    ok: bool
    detail: str = ""


def check(plan: List[Scene], ev: Evidence) -> List[Check]:
    out: List[Check] = []
    for scene in plan:
        out += _check_scene(scene, ev)
    out += _check_global(plan, ev)
    return out


def _check_scene(scene: Scene, ev: Evidence) -> List[Check]:
    k = scene.key
    checks: List[Check] = []

    def add(what: str, ok: bool, detail: str = "") -> None:
        checks.append(Check(k, what, bool(ok), "" if ok else detail))

    if not scene.event_id:
        return [Check(k, "event scheduled", False, "the simulator never created it")]
    sim = ev.sim_events.get(scene.event_id, {})
    add("Started, then gone (simulator)", sim.get("state") == "Completed" and sim.get("startedAt")
        and sim.get("goneAt"), f"simulator state {sim.get('state')}, startedAt {sim.get('startedAt')}")
    posts = ev.posts_for(scene.event_id)
    add(f"approved exactly once, by {scene.approver} (one POST in the simulator's request log)",
        [(p["vm"], p["status"]) for p in posts] == [(scene.approver, 200)],
        f"POSTs: {[(p['vm'], p['status']) for p in posts]}")
    add("approval started it (approvedBy)", sim.get("approvedBy") == [scene.approver],
        f"approvedBy {sim.get('approvedBy')}")

    row = ev.event_row(scene.event_id) or {}
    add("central: Completed, ever Started", row.get("Status") == "Completed" and row.get("EverStarted"),
        f"Events row Status {row.get('Status')}, EverStarted {row.get('EverStarted')}")
    approvals = get_json(row, "Approvals", []) if row else []
    if scene.central_message is None:
        add("central sent no approval message (the VM decided)", not approvals, f"Approvals {approvals}")
    else:
        sent = [(a.get("vmName"), a.get("action")) for a in approvals]
        add(f"central sent one approval message ({scene.central_message}) to {scene.approver}",
            sent == [(scene.approver, scene.central_message)], f"Approvals {sent}")
    results = [r for r in ev.tables["Decisions"]
               if r.get("EventId") == scene.event_id and r.get("Action") == "result"]
    approved = [(r.get("LeaderVmName"), r.get("DecidedBy")) for r in results if r.get("State") == "approved"]
    add(f"one 'approved' result from {scene.approver}, decided by {scene.decided_by}",
        approved == [(scene.approver, scene.decided_by)],
        f"results {[(r.get('LeaderVmName'), r.get('State'), r.get('DecidedBy')) for r in results]}")

    if scene.no_hook_installed:
        reasons = [str(r.get("Reason", "")) for r in results if r.get("State") == "approved"]
        add("the result says no pre-approve hook was installed (approved plainly)",
            len(reasons) == 1 and "no pre-approve hook installed" in reasons[0], f"result reasons {reasons}")

    runs = [h for h in ev.hooks if h.get("eventId") == scene.event_id]
    if scene.hook_first:
        ends = [h["t"] for h in runs if h["what"] == "end" and h.get("vm") == scene.approver]
        starts = [h for h in runs if h["what"] == "start"]
        post_t = posts[0]["t"] if posts else None
        add(f"drain hook ran once on {scene.approver}, finished before the POST",
            len(starts) == 1 and len(ends) == 1 and post_t is not None and ends[0] <= post_t,
            f"hook runs {[(h['vm'], h['what'], round(h['t'], 2)) for h in runs]}, POST at {post_t}")
    else:
        add("no hook ran (none asked for)", not runs, f"hook runs {runs}")

    keys = Counter(a["body"].get("key") for a in ev.alerts
                   if a["body"].get("eventId") == scene.event_id)
    want = {f"{scene.event_id}:{s}": 1 for s in scene.alerted}
    maybe = {f"{scene.event_id}:{s}": 1 for s in scene.maybe_alerted}
    posted = ", ".join(scene.alerted) or "none: an info rule"
    extra_ok = all(k in want or (k in maybe and n == 1) for k, n in keys.items())
    add(f"one alert per status posted by default ({posted}), not per VM",
        all(keys[k] == 1 for k in want) and extra_ok,
        f"alerts {dict((key.split(':', 1)[-1], n) for key, n in keys.items())}")
    return checks


def _check_global(plan: List[Scene], ev: Evidence) -> List[Check]:
    checks: List[Check] = []

    def add(what: str, ok: bool, detail: str) -> None:
        checks.append(Check("*", what, ok, "" if ok else detail))

    keys = Counter(a["body"].get("key") for a in ev.alerts)
    dupes = {k: n for k, n in keys.items() if n > 1}
    add("no alert delivered twice", not dupes, f"duplicates {dupes}")
    ours = {s.event_id for s in plan}
    stray = [p for p in ev.posts if not set(posted_ids(p)) <= ours]
    add("no other POST reached IMDS", not stray, f"stray POSTs {stray}")
    incs = Counter((r.get("VmId"), r.get("Incarnation")) for r in ev.tables["Incarnations"])
    dup_rows = {k: n for k, n in incs.items() if n > 1}
    add("one Incarnations row per VM incarnation", not dup_rows, f"duplicates {dup_rows}")
    failed = [r for r in ev.tables["Decisions"] if r.get("State") in ("approval-failed", "no-leader")]
    add("no approval failed, no leaderless event", not failed,
        f"{[(r.get('EventId'), r.get('State'), r.get('Reason')) for r in failed]}")
    critical = [a["body"].get("title") for a in ev.alerts if a["body"].get("severity") == "critical"]
    add("no critical alert", not critical, f"critical alerts: {critical}")
    if len(ev.instances) > 1:
        views = [(h.get("knownVms"), h.get("openEvents")) for h in ev.instances]
        add(f"every central instance ({len(ev.instances)}) answers from the same shared state",
            len(set(views)) == 1, f"(knownVms, openEvents) per instance: {views}")
    auth = [h.get("senderAuthentication") or {} for h in ev.instances]
    if any(a.get("enabled") for a in auth):
        accepted = sum(int(a.get("accepted", 0)) for a in auth)
        refused = sum(int(a.get("refused", 0)) for a in auth)
        add("every envelope authenticated as its VM (attested document + signature), none refused",
            accepted > 0 and refused == 0, f"accepted {accepted}, refused {refused}")
    return checks
