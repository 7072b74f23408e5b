"""Faults: a crash between the POST and the delete, a queue outage (Azurite killed, a new one started)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from sandbox import processes
from sandbox.imds.client import ImdsSimulator, wait_for

from .helpers import Rig, approval, make_rig


def test_crash_after_post_before_delete_never_posts_twice(rig: Rig, sim: ImdsSimulator, azurite,
                                                          tmp_path: Path) -> None:
    event_id = sim.add_event(eventType="Reboot", resources=["vm0"])["eventId"]
    msg = approval(event_id)
    rig.send(msg)
    crashed = subprocess.run([sys.executable, "-m", "tests.forwarder_approvals.crash_runner", sim.base_url,
                              azurite.extra["connection_string"], str(tmp_path)],
                             capture_output=True, text=True, timeout=60, cwd=processes.REPO)
    assert crashed.returncode == -9, crashed.stderr
    assert len(rig.posts()) == 1 and rig.results() == []  # POSTed, nothing reported, message not deleted
    # the message reappears after its visibility timeout (2 s); the restarted forwarder reads it again
    wait_for(lambda: list(rig.queue.peek_messages()), timeout=15, interval=0.2)
    rig.poll()
    assert len(rig.posts()) == 1, "a second pass must not POST again"
    ((outcome, reason),) = rig.outcomes()
    assert outcome == "approved" and "interrupted earlier attempt" in reason, reason
    assert rig.results()[0]["data"]["messageId"] == msg["messageId"]
    assert rig.queue_empty()


def test_queue_outage_retries_and_recovers(sim: ImdsSimulator, tmp_path: Path) -> None:
    first = processes.start_azurite(log_dir=tmp_path / "azurite1")
    second = None
    rig = make_rig(sim.base_url, first.extra["connection_string"], tmp_path)
    stop = threading.Event()
    try:
        # A week of notice: the event stays Scheduled however long the outage and Azurite's restart take
        # on a loaded machine (with the default 15 min = 15 s real it could start first, and then no
        # approval may be POSTed: the flake this test once had).
        week = 7 * 24 * 3600
        event_id = sim.add_event(eventType="Reboot", resources=["vm0"], noticeSeconds=week)["eventId"]
        rig.observe()  # a Scheduled event: the queue is read
        reader = rig.service.ensure_reader()
        reader.stop = stop
        thread = threading.Thread(target=reader.run, kwargs={"max_seconds": 60}, daemon=True)
        thread.start()
        wait_for(lambda: reader.stats["receives"] >= 1, timeout=10)
        first.kill()  # outage
        wait_for(lambda: reader.stats["errors"] >= 2, timeout=30, interval=0.1)
        assert thread.is_alive(), "the reader keeps running through the outage"
        assert reader.last_error
        second = processes.start_azurite(log_dir=tmp_path / "azurite2", ports=first.ports)
        rig.queue.create_queue()  # a new, empty Azurite: central would re-create the queue on send
        rig.send(approval(event_id))
        wait_for(lambda: rig.posts(), timeout=60, interval=0.1)
        wait_for(lambda: rig.results(), timeout=30, interval=0.1)
        assert rig.outcomes()[0][0] == "approved" and len(rig.posts()) == 1
        assert sim.event(event_id)["state"] == "Started"  # approved by the POST, not by NotBefore
    finally:
        stop.set()
        rig.service.close()
        rig.queue.close()
        rig.outbox.close()
        rig.imds.close()
        for server in (first, second):
            if server is not None:
                server.kill()
