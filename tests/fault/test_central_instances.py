"""Central as three Functions runner processes (the real function_app.py) sharing one sandbox hub with 8
partitions: the real EventHubConsumerClient with BlobCheckpointStore spreads the partitions over them. A
simulated fleet in scale sets under a budget of one VM per scale set walks its Reboots through; one
runner is SIGKILLed while a batch executes, its partitions move to the others. Afterwards: nothing
lost (every incarnation recorded, every event Completed, every Scheduled alert delivered), nothing
approved twice, never two VMs of one scale set approved at once. The reevaluate timer runs on one
runner at a time (the host's singleton lease); when the killed runner held it, a survivor takes it
over once the lease has run out (host.json singleton: within 30 s)."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, List, Set

import pytest

from sandbox import processes
from sandbox.functions.hostconfig import HostConfig
from tests.central.factory import Vm, event
from tests.functions.conftest import REPO

from .central_rig import (
    HUB,
    approval_messages,
    publish,
    runner_dir,
    runner_settings,
    start_central,
    table_rows,
    wait_for,
    webhook_alerts,
)
from .test_central_restarts import kill_mid_batch

FORMS = {"short": {"vms": 9, "sets": 3}, "full": {"vms": 30, "sets": 5}}
POLICY = {
    "version": 1,
    "budgets": {"one-per-set": {"groupBy": "scaleSet", "maxImpacted": 1}},
    "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}],
}


def now() -> datetime:
    return datetime.now(timezone.utc)


# The runner's log line when it takes the reevaluate timer's singleton lease (sandbox/functions/timer.py).
TIMER_TAKEN = "Host.Functions.reevaluate.Listener): the timer runs here"
PARTITION = re.compile(r"Executing 'Functions\.ingest' \(Reason='\(null\) partition=(\d+)")


def log_text(runner: processes.Server) -> str:
    path = runner.log_path
    return path.read_text(errors="replace") if path and path.exists() else ""


def partitions(text: str) -> Set[str]:
    """The partitions a runner's log shows ingest batches of."""
    return set(PARTITION.findall(text))


@pytest.mark.parametrize("form", ["short", pytest.param("full", marks=pytest.mark.slow)])
def test_three_runners_share_the_partitions_and_survive_a_kill(form: str, tmp_path: Path) -> None:
    size = FORMS[form]
    rng = random.Random(5)  # noqa: S311 - reproducible kill timing
    azurite = processes.start_azurite(log_dir=tmp_path)
    hub = processes.start_eventhubs([f"{HUB}=8", f"{processes.PLATFORM_HUB}=1"], log_dir=tmp_path)
    webhook = processes.start_webhook_receiver(log_dir=tmp_path)
    storage = azurite.extra["connection_string"]
    conn = processes.eventhubs_connection_string(hub.port, HUB)
    vms = [
        Vm(f"s{i % size['sets']}-vm{i:02d}", scale_set=f"set{i % size['sets']}") for i in range(size["vms"])
    ]
    events = {vm.name: f"E-{i:03d}-{vm.name}" for i, vm in enumerate(vms)}
    runners: List[processes.Server] = []
    approved_at: Dict[str, float] = {}
    overruns: List[str] = []
    killed = mid_batch = False
    victim: processes.Server = None  # type: ignore[assignment]
    served: Set[str] = set()  # partitions the killed runner had served
    survivors_at_kill: Dict[int, int] = {}  # log length of each survivor when the kill happened
    last_round = 0.0
    try:
        for n in range(3):
            files = runner_dir(tmp_path, n)
            runner_settings(
                files,
                storage,
                hub.port,
                "central",
                f"http://127.0.0.1:{webhook.port}/hook",
                extra={"POLICY_JSON": json.dumps(POLICY), "LEADER_LIVENESS_SECONDS": "600"},
            )
            runners.append(start_central(files))
        nb = now() + timedelta(hours=2)
        publish(
            conn,
            [
                e
                for vm in vms
                for e in (
                    vm.heartbeat(at=now()),
                    vm.incarnation_env([event(events[vm.name], [vm.name], not_before=nb)], at=now()),
                )
            ],
        )
        started: Set[str] = set()
        gone: Set[str] = set()
        deadline = time.monotonic() + (240 if form == "short" else 600)
        while len(gone) < len(vms) and time.monotonic() < deadline:
            if time.monotonic() - last_round > 2:  # every VM heartbeats: every partition it uses is busy
                publish(conn, [vm.heartbeat(at=now()) for vm in vms])
                last_round = time.monotonic()
            if not killed and len(started) >= size["sets"]:
                # the runner that served the most partitions, killed while one of its batches executes
                victim = max(runners, key=lambda r: (len(partitions(log_text(r))), -runners.index(r)))
                survivors_at_kill = {i: len(log_text(r)) for i, r in enumerate(runners) if r is not victim}
                mid_batch = kill_mid_batch(victim, rng, timeout=60)
                served = partitions(log_text(victim))
                killed = True
            rows = {r["EventId"]: r for r in table_rows(storage, "Events")}
            out: List[dict] = []
            for vm in vms:
                eid = events[vm.name]
                if (
                    vm.name in started
                    and vm.name not in gone
                    and rows.get(eid, {}).get("Status") == "Started"
                ):
                    out += [vm.heartbeat(at=now()), vm.incarnation_env([], at=now())]  # rebooted: gone
                    gone.add(vm.name)
                elif vm.name not in started and approval_messages(storage, vm.vm_id):
                    # the rows as of after the approval was seen: the commit that ends one event may approve
                    # the next in the same transaction, so a snapshot read before the queue can predate it
                    now_rows = {r["EventId"]: r for r in table_rows(storage, "Events")}
                    busy = [
                        u.name
                        for u in vms
                        if u.scale_set == vm.scale_set
                        and u.name != vm.name
                        and u.name in approved_at
                        and now_rows.get(events[u.name], {}).get("Status") != "Completed"
                    ]
                    if busy:
                        overruns.append(f"{vm.name} approved while {busy} not Completed")
                    approved_at[vm.name] = time.monotonic()
                    msg = approval_messages(storage, vm.vm_id)[0]
                    out += [
                        vm.result(eid, "approved", msg["messageId"], at=now()),
                        vm.incarnation_env([event(eid, [vm.name], status="Started")], at=now()),
                    ]
                    started.add(vm.name)
            if out:
                publish(conn, out)
            time.sleep(0.5)
        wait_for(
            lambda: (
                all(r.get("Status") == "Completed" for r in table_rows(storage, "Events"))
                and len(table_rows(storage, "Events")) == len(vms)
            ),
            timeout=90,
            what="every event Completed",
        )
        if TIMER_TAKEN in log_text(victim):  # the timer moves once the lease has run out, and a poll came
            slowest = HostConfig.load(REPO / "host.json").singleton.takeover_seconds()[1]
            wait_for(lambda: any(TIMER_TAKEN in log_text(runners[i])[offset:]
                                 for i, offset in survivors_at_kill.items()),
                     timeout=slowest + 15, what="a survivor holding the reevaluate timer")
        wait_for(
            lambda: (  # an alert the killed runner had claimed comes from the timer after its 60 s lease
                {f"{e}:{status}" for e in events.values() for status in ("Scheduled", "Started")}
                <= {a.get("key") for a in webhook_alerts(webhook)}
            ),
            timeout=150,
            what="every Scheduled and Started alert",
        )
        incarnations = table_rows(storage, "Incarnations")
        rows = table_rows(storage, "Events")
        queues = {vm.name: approval_messages(storage, vm.vm_id) for vm in vms}
        alerts = webhook_alerts(webhook)
        logs = [
            r.log_path.read_text(errors="replace") if r.log_path and r.log_path.exists() else ""
            for r in runners
        ]
    finally:
        for r in runners:
            if r.proc.poll() is None:
                r.stop()
        webhook.stop()
        hub.stop()
        azurite.stop()

    assert killed and mid_batch, "the runner was killed while a batch executed"
    assert overruns == [], overruns
    assert sum("ingest:" in text for text in logs) >= 2, "at least two runners processed batches"
    taken_over = set().union(*(partitions(logs[i][offset:]) for i, offset in survivors_at_kill.items()))
    assert served and served <= taken_over, f"partitions {sorted(served - taken_over)} were never taken over"
    victim_index = runners.index(victim)
    before = [logs[i][:survivors_at_kill[i]] if i in survivors_at_kill else logs[i] for i in range(len(logs))]
    after = [logs[i][survivors_at_kill[i]:] for i in survivors_at_kill]
    holders = [i for i, text in enumerate(before) if TIMER_TAKEN in text]
    assert len(holders) == 1 and before[holders[0]].count(TIMER_TAKEN) == 1, "the timer on one runner"
    ran = [i for i, text in enumerate(before) if "Executing 'Functions.reevaluate'" in text]
    assert ran == holders, f"reevaluate ran on runners {ran}; only {holders} held the timer"
    moved = sum(text.count(TIMER_TAKEN) for text in after)
    assert moved == (1 if holders == [victim_index] else 0), "the timer moved only if its holder died"
    assert len({(r["VmId"], r["Incarnation"]) for r in incarnations}) == 3 * len(vms), "an incarnation lost"
    assert len(rows) == len(vms) and all(r["Status"] == "Completed" for r in rows)
    for vm in vms:
        mine = [m for m in queues[vm.name] if m["eventId"] == events[vm.name]]
        assert len(mine) <= 1, f"{vm.name}: approved twice"
    assert all(json.loads(r["Approvals"])[0]["sent"] for r in rows), "an attempt left unsent"
    keys = Counter(a["key"] for a in alerts if a.get("kind") == "event-status")
    for eid in events.values():
        assert keys[f"{eid}:Scheduled"] >= 1 and keys[f"{eid}:Started"] >= 1, eid
    print(
        f"vms={len(vms)} runners=3 partitions=8 killed mid-batch={mid_batch} its partitions={sorted(served)} "
        f"taken over by the others timer held by {holders} (victim {victim_index}, moved {moved}) "
        f"alerts={len(alerts)} "
        f"repeats={sum(c - 1 for c in keys.values())}"
    )
