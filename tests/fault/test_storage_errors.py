"""Storage answering errors, not frozen (issue 50): the three runner processes reach Azurite through
sandbox/fault_proxy.py's StorageProxy, which for a window answers every request (blob checkpoints and
ownership, the State and log tables, the approval queues) with 503 ServerBusy, 500 InternalError or 429 with
Retry-After, in Azure Storage's own error format. Each window opens just as a Reboot is made on every VM, so
central meets the fault while it has work to do. The forwarders read their queues from Azurite directly.

After each window: every event recorded, no budget exceeded, nothing approved twice, the held Freeze still
held, and every Reboot of the round approved within RECOVERY_BOUND seconds of the window's end
(the measured figure is printed). Full form (`make fault`): an unfaulted round, then a 60 s window of each
status; short form (`make test`): one round under 2 s of each status back to back.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .pipeline_rig import FULL_FORM, Rig

FAULTS = [(503, 2), (500, None), (429, 3)]  # (status, Retry-After seconds)
# full: a round per status, each a 60 s window; short: one round, 2 s of each status back to back
FORMS = {"short": [[(s, r, 2.0) for s, r in FAULTS]], "full": [[(s, r, 60.0)] for s, r in FAULTS]}
RECOVERY_BOUND = 120.0  # generous: a round takes ~10 s unfaulted (two Reboots in turn per set)


@pytest.mark.parametrize("form", ["short", FULL_FORM])
def test_storage_errors_for_a_window_then_recovery(form: str, tmp_path: Path) -> None:
    rig = Rig(tmp_path, storage_proxy=True)
    figures = []
    try:
        rig.start()
        rig.hold_one()
        if form == "full":  # an unfaulted round first: the figure to compare with
            baseline = rig.reboot_all()
            baseline.fault_ended = time.time()
            figures.append(("nothing", 0.0, rig.finish(baseline, RECOVERY_BOUND)))
        assert rig.proxy is not None
        for windows in FORMS[form]:
            rnd = None
            for status, retry_after, seconds in windows:
                faulted_before = rig.proxy.faulted
                rig.proxy.fail(status, seconds, retry_after)
                rnd = rnd or rig.reboot_all()  # made as the first window opens
                time.sleep(seconds)
                assert rig.proxy.faulted > faulted_before, f"no request met the {status} window"
            assert rnd is not None
            rnd.fault_ended = time.time()
            name = "/".join(str(w[0]) for w in windows)
            figures.append((name, sum(w[2] for w in windows), rig.finish(rnd, RECOVERY_BOUND)))
            rig.check()
        summary = rig.check()
    finally:
        rig.stop()
    for name, seconds, took in figures:
        print(f"storage answering {name} for {seconds:g} s: every Reboot approved {took:.1f} s later")
    print(f"checked: {summary}")
