"""Two of the three central runner processes killed at the same instant, during a maintenance wave (issue 50).

The wave: a Reboot on every VM, one VM per availability set at a time (the budget). Once the wave's first
approval is POSTed, two runners are SIGKILLed back to back (the same instant, as when a host goes), the
third carries on alone: it takes over their Event Hubs partitions once their ownership expires and the
reevaluate timer once its lease has run out. The two are started again a few seconds later, as the
platform restarts instances. Full form (`make fault`): 8 VMs, twice (each time a different pair, the
second kill once the wave has moved on); short form (`make test`): 4 VMs, once.

After the wave: every event recorded, no budget exceeded, nothing approved twice, the held Freeze still
held, and the wave over within RECOVERY_BOUND seconds of the last kill (the figure is printed).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import List

import pytest

from tests.forwarder.helpers import wait_until

from .pipeline_rig import FULL_FORM, Rig

FORMS = {"short": {"vms": 4, "kills": 1}, "full": {"vms": 8, "kills": 2}}
RESTART_AFTER = 3.0  # seconds the two stay dead
RECOVERY_BOUND = 240.0  # generous: partition ownership and the timer's lease must expire first


def kill_together(rig: Rig, names: List[str]) -> None:
    """SIGKILL each by PID back to back, then reap them."""
    servers = [rig.fleet.servers[n] for n in names]  # type: ignore[union-attr]
    for server in servers:
        os.kill(server.pid, signal.SIGKILL)
    for server in servers:
        server.proc.wait(timeout=10)


@pytest.mark.parametrize("form", ["short", FULL_FORM])
def test_two_of_three_runners_killed_at_once_during_a_wave(form: str, tmp_path: Path) -> None:
    size = FORMS[form]
    rig = Rig(tmp_path, vm_count=size["vms"])
    killed: List[List[str]] = []
    try:
        rig.start()
        rig.hold_one()
        runners = list(rig.fleet.runner_names)  # type: ignore[union-attr]
        assert len(runners) == 3
        rnd = rig.reboot_all()
        last_kill = 0.0
        for k in range(size["kills"]):
            # once the wave has had k + 1 approvals: the first kill early in it, the second further on
            wait_until(lambda k=k: sum(e in rig.post_times() for e in rnd.events) >= k + 1, 120, 0.5,
                       f"approval {k + 1} of the wave")
            pair = [runners[(k + i) % 3] for i in range(2)]
            kill_together(rig, pair)
            last_kill = time.time()
            killed.append(pair)
            time.sleep(RESTART_AFTER)
            for name in pair:
                rig.fleet.restart_runner(name)  # type: ignore[union-attr]
        rnd.fault_ended = last_kill
        recovered = rig.finish(rnd, RECOVERY_BOUND)
        summary = rig.check()
    finally:
        rig.stop()
    print(f"killed {killed} ({size['vms']} VMs): the wave over {recovered:.1f} s after the last kill; "
          f"checked {summary}")
