"""The whole pipeline for the fault suite's Azure faults (issue 50): the demo's fleet (sandbox/demo/fleet.py:
Azurite, the Event Hubs server, the IMDS simulator, three Functions runner processes running the real
function_app.py, one real forwarder process per VM) with a stand-in from sandbox/fault_proxy.py where the
fault goes, and the checks every fault ends with:

- every event recorded (a row in central's State table for each event the simulator made);
- no budget exceeded (within each budget group, no two VMs' events Started at once, by the simulator's own
  startedAt/goneAt) and nothing approved twice (the simulator's record of POSTs: one per approved event);
- held events still held (no POST, still Scheduled in the simulator, no approval attempt in central).

Recovery is timed from the end of the fault to the moment every event made for the round is approved and
over (Completed), by the simulator's record.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from azure.data.tables import TableServiceClient

from central.store.state_rows import read_table
from central.store.tables import get_json
from sandbox import processes
from sandbox.demo.fleet import HUB, TABLE_PREFIX, Fleet, FleetSettings, VmSpec
from sandbox.demo.scenario import posted_ids
from sandbox.fault_proxy import StorageProxy, TcpGate
from tests.forwarder.helpers import backlog, wait_until
from tools.any_date import pitfalls_env

# The full form of each fault (`make fault`): it outlasts pytest-timeout's default of 300 s.
FULL_FORM = pytest.param("full", marks=[pytest.mark.slow, pytest.mark.timeout(1200)])
TIME_SCALE = 5.0  # simulated seconds per real second (the simulator's clock; central and forwarders: real)
STARTED_SECONDS = 10  # simulated seconds a Reboot stays Started once approved (2 s real)
NOTICE_SECONDS = 86400  # a day's notice: nothing starts by itself in a test
BUDGET_TAG = "avset"
POLICY: Dict[str, Any] = {
    "version": 1,
    "description": "fault suite: reboots one at a time per availability set, freezes held",
    "budgets": {"one-per-avset": {"groupBy": "tag", "tag": BUDGET_TAG, "maxImpacted": 1}},
    "rules": [
        {"name": "hold-freezes", "match": {"eventTypes": ["Freeze"]}, "action": "hold"},
        {"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"},
    ],
}


def vms(count: int) -> List[VmSpec]:
    """`count` VMs, two to an availability set (the budget's group)."""
    return [VmSpec(f"fvm{i}", {BUDGET_TAG: f"set{i // 2}"}) for i in range(count)]


@dataclass
class Round:
    """The events made for one fault (one Reboot per VM), and when the fault ended."""

    events: List[str]
    fault_ended: float = 0.0  # time.time()
    recovered_after: Optional[float] = None  # seconds from fault_ended to every event approved and over


@dataclass
class Rig:
    work: Path
    vm_count: int = 4
    central_instances: int = 3
    storage_proxy: bool = False  # the runners reach Azurite through a StorageProxy
    hub_gate: bool = False  # the forwarders and the runners reach Event Hubs through a TcpGate
    central_extra: Dict[str, str] = field(default_factory=dict)
    runner_env: Dict[str, Dict[str, str]] = field(default_factory=dict)  # e.g. one runner's moved clock
    policy: Dict[str, Any] = field(default_factory=lambda: dict(POLICY))
    fleet: Optional[Fleet] = None
    proxy: Optional[StorageProxy] = None
    gate: Optional[TcpGate] = None
    held: List[str] = field(default_factory=list)
    rounds: List[Round] = field(default_factory=list)

    # ---- start / stop ---------------------------------------------------------------------------
    def start(self) -> Rig:
        azurite = processes.start_azurite(log_dir=self.work / "azurite")
        # The product's default liveness (the demo's fleet sets 60 s for its own pace): with 60 s, central
        # catching up after a 60 s Storage fault judges every forwarder dead by the age of the envelopes it
        # is only now reading, and routes the approval through ARM (found by this suite; see the report).
        extra = {"LEADER_LIVENESS_SECONDS": "300", **self.central_extra}
        if self.storage_proxy:
            self.proxy = StorageProxy(azurite).start()
            extra.update({"AzureWebJobsStorage": self.proxy.connection_string,
                          "ApprovalStorage": self.proxy.connection_string})
        hub = None
        if self.hub_gate:
            hub = processes.start_eventhubs((f"{HUB}=4", f"{processes.PLATFORM_HUB}=2"),
                                            log_dir=self.work / "eventhubs")
            self.gate = TcpGate(hub.port).start()
            extra.update(processes.central_hub_settings(self.gate.port, HUB))
        settings = FleetSettings(
            work=self.work / "fleet", vms=vms(self.vm_count), time_scale=TIME_SCALE, policy=self.policy,
            drain_hook=False, local_approve=False, approval_fast_interval=0.5, approval_slow_interval=5,
            central_instances=self.central_instances, central_extra=extra, runner_env=self.runner_env,
            eventhubs_port=self.gate.port if self.gate else None)
        self.fleet = Fleet(settings)
        try:
            self.fleet.start(azurite=azurite, eventhubs=hub)
            self.fleet.wait_until_central_knows_every_vm(timeout=90)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        if self.proxy is not None:
            self.proxy.stop()
        if self.gate is not None:
            self.gate.stop()

    # ---- events -----------------------------------------------------------------------------------
    @property
    def imds(self) -> Any:
        assert self.fleet is not None and self.fleet.imds is not None
        return self.fleet.imds

    def hold_one(self) -> str:
        """A Freeze on the first VM (the policy holds it); returns once central has decided to hold it."""
        vm = self.fleet.settings.vms[0].name  # type: ignore[union-attr]
        eid = str(self.imds.add_event(eventType="Freeze", eventSource="Platform", resources=[vm],
                                      noticeSeconds=NOTICE_SECONDS, durationInSeconds=30)["eventId"])
        self.held.append(eid)
        wait_until(lambda: self.event_rows().get(eid, {}).get("State") not in (None, "new"), 90, 0.5,
                   "central to decide the held Freeze")
        return eid

    def reboot_all(self) -> Round:
        """One Reboot on every VM (the budget lets one per availability set start at a time)."""
        spec = {"eventType": "Reboot", "eventSource": "Platform", "noticeSeconds": NOTICE_SECONDS,
                "startedSeconds": STARTED_SECONDS}
        ids = [str(self.imds.add_event(resources=[vm.name], **spec)["eventId"])
               for vm in self.fleet.settings.vms]  # type: ignore[union-attr]
        self.rounds.append(Round(ids))
        return self.rounds[-1]

    def finish(self, rnd: Round, timeout: float) -> float:
        """Wait (bounded) for every event of `rnd` approved and over; the seconds since the fault ended."""
        wait_until(lambda: all(self.imds.event(e)["state"] == "Completed" for e in rnd.events), timeout, 0.5,
                   "every event of the round approved and Completed")
        # the POSTs' real times (the simulator's own event times run TIME_SCALE times faster)
        posts = self.post_times()
        last = max(posts[e][0] for e in rnd.events)
        rnd.recovered_after = max(0.0, last - rnd.fault_ended)
        return rnd.recovered_after

    # ---- evidence ---------------------------------------------------------------------------------
    def post_times(self) -> Dict[str, List[float]]:
        """Event id -> the real times (epoch) of the simulator's POSTs that approved it."""
        out: Dict[str, List[float]] = {}
        for post in self.imds.requests(method="POST"):
            for eid in posted_ids(post):
                out.setdefault(eid, []).append(float(post["t"]))
        return out

    def backlogs(self) -> Dict[str, int]:
        """Each forwarder's outbox rows not yet published."""
        fleet = self.fleet
        assert fleet is not None
        return {vm.name: backlog(fleet.vm_dir(vm.name) / "state") for vm in fleet.settings.vms}

    def alert_keys(self) -> Counter:
        """How many times the webhook receiver got each alert key."""
        record = self.fleet.work / "alerts.jsonl"  # type: ignore[union-attr]
        lines = record.read_text().splitlines() if record.exists() else []
        bodies = [json.loads(line).get("body") for line in lines if line.strip()]
        return Counter(b.get("key", "") for b in bodies if isinstance(b, dict))

    def event_rows(self) -> Dict[str, Dict[str, Any]]:
        """Central's Events rows, read straight from Azurite (not through a fault)."""
        service = TableServiceClient.from_connection_string(self.fleet.storage)  # type: ignore[union-attr]
        return {r["EventId"]: r for r in read_table(service, TABLE_PREFIX, "Events")}

    def check(self) -> Dict[str, Any]:
        """The invariants every fault ends with (AssertionError naming the first broken one)."""
        fleet = self.fleet
        assert fleet is not None
        assert fleet.exited() == [], f"a process died: {fleet.exited()}"
        rows = self.event_rows()
        made = [e for rnd in self.rounds for e in rnd.events] + self.held
        missing = [e for e in made if e not in rows]
        assert missing == [], f"events never recorded by central: {missing}"
        posts = Counter({e: len(t) for e, t in self.post_times().items()})
        twice = {e: n for e, n in posts.items() if n > 1}
        assert twice == {}, f"approved more than once: {twice}"
        reboots = [e for rnd in self.rounds for e in rnd.events]
        assert [e for e in reboots if posts[e] != 1] == [], "every Reboot approved exactly once"
        for eid in self.held:
            assert posts[eid] == 0, f"held {eid} was approved"
            assert self.imds.event(eid)["state"] == "Scheduled", f"held {eid} no longer Scheduled"
            assert int(rows[eid].get("ApprovalCount") or 0) == 0, f"held {eid} has an approval attempt"
            assert get_json(rows[eid], "Decision", {}).get("action") == "hold", rows[eid].get("Decision")
        overlaps = budget_overlaps(self.imds, fleet.settings.vms, reboots)
        assert overlaps == [], f"budget exceeded: {overlaps}"
        return {"events": len(made), "posts": sum(posts.values()), "held": len(self.held)}


LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")  # Debian's faketime package


def clock_ahead(seconds: int) -> Dict[str, str]:
    """The environment that moves one process's calendar `seconds` ahead with libfaketime, with the known
    pitfalls handled (tools/any_date.py): the monotonic clock left alone, and time.sleep through select()."""
    if not LIBFAKETIME.exists():
        raise RuntimeError(f"{LIBFAKETIME} is missing: apt-get install faketime (.ci/run installs it)")
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": f"+{seconds}",
            **pitfalls_env(os.environ.get("PYTHONPATH", ""))}


def budget_overlaps(imds: Any, specs: List[VmSpec], events: List[str]) -> List[str]:
    """Pairs of events of one budget group that were Started at the same time (simulator's clock)."""
    group = {vm.name: vm.tags[BUDGET_TAG] for vm in specs}
    spans: Dict[str, List[tuple]] = {}
    for eid in events:
        ev = imds.event(eid)
        if not ev.get("startedAt"):
            continue
        end = parse(ev["goneAt"]) if ev.get("goneAt") else float("inf")
        spans.setdefault(group[ev["resources"][0]], []).append((parse(ev["startedAt"]), end, eid))
    out = []
    for items in spans.values():
        items.sort()
        for (_, end, a), (start, _, b) in zip(items, items[1:]):
            if start < end:
                out.append(f"{a} and {b}")
    return out


def parse(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
