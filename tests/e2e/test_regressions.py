"""Bugs the full loop found, each reproduced on its own (real simulator, Azurite, forwarder code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from sandbox import processes
from sandbox.imds.client import ImdsSimulator
from tests.forwarder_approvals.helpers import VM0, Rig, make_rig


@pytest.fixture
def rig(azurite: processes.Server, tmp_path: Path) -> Iterator[Rig]:
    imds = processes.start_imds(["--time-scale", "60", "--vm", json.dumps(VM0)], log_dir=tmp_path)
    sim = ImdsSimulator(f"http://127.0.0.1:{imds.port}")
    r = make_rig(sim.base_url, azurite.extra["connection_string"], tmp_path)
    try:
        yield r
    finally:
        r.service.close()
        r.queue.close()
        r.outbox.close()
        r.imds.close()
        sim.close()
        imds.stop()


def test_reader_polls_fast_for_a_scheduled_event_before_central_created_the_queue(rig: Rig) -> None:
    """Central creates a VM's queue with its first approval, AFTER the VM saw the event Scheduled.
    The reader used to treat the missing queue as a reason to poll slowly (60 s in production),
    so every VM's first approval waited up to a minute."""
    rig.queue.delete_queue()
    rig.sim.add_event(eventType="Reboot", eventSource="User", resources=[VM0["name"]])
    rig.observe()
    rig.poll()
    reader = rig.service.reader
    assert reader is not None and reader.queue_missing
    assert reader.interval() == reader.settings.fast_interval
