"""Event Hubs unreachable (issue 50): the forwarders and the three runner processes reach the Event Hubs
server through sandbox/fault_proxy.py's TcpGate, which is cut (every open connection closed, every new one
closed on accept) as a Reboot is made on every VM. The forwarders keep polling IMDS, their outboxes grow,
and once the gate opens again they drain, in order; central catches up without delivering any alert twice.

After the outage: every event recorded, no budget exceeded, nothing approved twice, the held Freeze still
held, every outbox back to empty, and every VM's envelopes on the hub in the order they were made (read back
by a separate consumer group, straight from the server). Short form (`make test`): 5 s; full (`make fault`):
5 minutes.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List

import pytest

from sandbox import processes
from tests.forwarder.helpers import wait_until
from tests.forwarder_eventhubs.helpers import Consumer, Received

from .pipeline_rig import FULL_FORM, HUB, Rig

FORMS = {"short": 5.0, "full": 300.0}  # seconds the hub is unreachable
RECOVERY_BOUND = 180.0  # generous: the Event Hubs clients back off while the hub is away


def out_of_order(items: List[Received]) -> List[str]:
    """Per VM and envelope type, in the hub's order (partition, sequence) with repeats of an envelope
    dropped: an envelope made before the one ahead of it, or an incarnation not above the one before.
    (Per type: the poller and the heartbeat are separate threads, so a heartbeat stamped a few ms after an
    incarnation can be queued before it; the outbox keeps the order envelopes were queued in.)"""
    by_vm: Dict[tuple, List[Received]] = {}
    for item in sorted(items, key=lambda r: (r.partition, r.sequence)):
        by_vm.setdefault((item.vm_id, item.type), []).append(item)
    problems = []
    for vm, mine in by_vm.items():
        seen, last_time, last_inc = set(), "", -1
        for item in mine:
            env = item.envelope
            if env["id"] in seen:
                continue
            seen.add(env["id"])
            if env["time"] < last_time:
                problems.append(f"{vm}: {env['type']} {env['id']} made at {env['time']} after {last_time}")
            last_time = max(last_time, env["time"])
            if env["type"].endswith("incarnation.v1"):
                number = int(env["data"]["incarnation"])
                if number <= last_inc:
                    problems.append(f"{vm}: incarnation {number} after {last_inc}")
                last_inc = max(last_inc, number)
    return problems


@pytest.mark.parametrize("form", ["short", FULL_FORM])
def test_eventhubs_unreachable_then_drained_in_order(form: str, tmp_path: Path) -> None:
    seconds = FORMS[form]
    rig = Rig(tmp_path, hub_gate=True)
    consumer = None
    try:
        rig.start()
        rig.hold_one()
        assert rig.gate is not None
        alerts_before = rig.alert_keys()
        rig.gate.cut(seconds)
        rnd = rig.reboot_all()
        peak: Dict[str, int] = {}
        while rig.gate.window.active():
            for vm, rows in rig.backlogs().items():
                peak[vm] = max(peak.get(vm, 0), rows)
            time.sleep(1.0)
        rnd.fault_ended = time.time()
        refused = rig.gate.refused
        recovered = rig.finish(rnd, RECOVERY_BOUND)
        wait_until(lambda: not any(rig.backlogs().values()), 60, 0.5, "every outbox drained")
        summary = rig.check()
        time.sleep(3)  # a late duplicate alert would arrive now (the timer runs every 2 s)
        alerts = rig.alert_keys()
        hub_port = rig.fleet.servers["eventhubs"].port  # type: ignore[union-attr]
        consumer = Consumer(processes.eventhubs_connection_string(hub_port, HUB)).start()
        # read back up to now: every VM's heartbeats go on, so "up to now" is an envelope made after this
        since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        vm_count = len(rig.fleet.settings.vms)  # type: ignore[union-attr]

        def caught_up() -> bool:
            return len({r.vm_id for r in consumer.items() if r.envelope["time"] >= since}) == vm_count

        try:
            wait_until(caught_up, 90, 1.0, "the hub read back up to now")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; consumer errors: {consumer.errors[:3]}") from None
        order = out_of_order(consumer.items())
    finally:
        if consumer is not None:
            consumer.close()
        rig.stop()
    assert all(peak.get(vm.name, 0) > 0 for vm in rig.fleet.settings.vms), f"outboxes did not grow: {peak}"
    assert order == [], order
    repeated = {k: n for k, n in alerts.items() if n > 1}
    assert repeated == {}, f"alerts delivered more than once: {repeated}"
    print(f"hub unreachable {seconds:g} s (connections refused {refused}): outbox peak rows {peak}; "
          f"every Reboot approved {recovered:.1f} s after it came back; alerts during/after "
          f"{sum(alerts.values()) - sum(alerts_before.values())}, repeated 0; checked {summary}")
