"""The wiring: `se-forwarder run` (a real daemon process) reads its queue, POSTs, publishes the result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from forwarder.approvals import naming
from sandbox import processes
from sandbox.imds.client import ImdsSimulator, wait_for

from .helpers import VM0, approval, write_hook


def _published(path: Path, type_: str) -> list:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in lines if e["type"] == type_]


def test_daemon_approves_from_queue_and_publishes_result(
    sim: ImdsSimulator, azurite, tmp_path: Path
) -> None:
    from azure.storage.queue import QueueClient

    conn = azurite.extra["connection_string"]
    queue = QueueClient.from_connection_string(conn, naming.queue_name(VM0["vmId"]))
    try:
        queue.create_queue()
    except Exception:
        queue.clear_messages()
    hooks = tmp_path / "hooks"
    post = tmp_path / "post-ran"
    write_hook(hooks, "post-event", "10-note", f"echo $SE_EVENT_ID >> {post}")
    sink = tmp_path / "published.jsonl"
    env = {
        **os.environ,
        "SE_FORWARDER_IMDS_URL": sim.vm_url("vm0"),
        "SE_FORWARDER_STATE_DIR": str(tmp_path / "s"),
        "SE_FORWARDER_SINK": "file",
        "SE_FORWARDER_SINK_FILE": str(sink),
        "SE_FORWARDER_POLL_INTERVAL": "0.25",
        "SE_FORWARDER_QUEUE_CONNECTION_STRING": conn,
        "SE_FORWARDER_APPROVAL_FAST_INTERVAL": "0.2",
        "SE_FORWARDER_APPROVAL_SLOW_INTERVAL": "2",
        "SE_FORWARDER_HOOK_DIR": str(hooks),
        "SE_FORWARDER_CONFIG": str(tmp_path / "config.json"),
    }
    (tmp_path / "config.json").write_text("{}")
    log = open(tmp_path / "forwarder.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "forwarder", "run"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=processes.REPO,
    )
    try:
        event_id = sim.add_event(
            eventType="Reboot", eventSource="User", resources=["vm0"], startedSeconds=1
        )["eventId"]
        wait_for(lambda: _published(sink, "scheduledevents.incarnation.v1"), timeout=20, interval=0.1)
        queue.send_message(json.dumps(approval(event_id)))
        wait_for(lambda: sim.requests(vm="vm0", method="POST"), timeout=20, interval=0.1)
        results = wait_for(lambda: _published(sink, "scheduledevents.approvalresult.v1"), timeout=20)
        assert results[0]["data"]["outcome"] == "approved" and results[0]["data"]["eventId"] == event_id
        # Started for 1 simulated s, then gone: the post-event hook runs and `completed` is published
        wait_for(lambda: len(_published(sink, "scheduledevents.approvalresult.v1")) >= 2, timeout=20)
        assert post.read_text().split() == [event_id]
        assert len(sim.requests(vm="vm0", method="POST")) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
        queue.close()
    assert code == 0, (tmp_path / "forwarder.log").read_text()[-3000:]
