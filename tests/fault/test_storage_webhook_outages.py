"""Storage queue outage during an approval and webhook outage during its alerts: retries, nothing lost.

The full loop with real parts: IMDS simulator -> forwarder (real process: file sink, approval queue
reader) -> central (CentralService in this process, fed the forwarder's envelopes as the ingest
function would be, its timer called as the Functions timer would) -> approval in the VM's Storage
queue -> the forwarder POSTs StartRequests to IMDS. Tables live on one Azurite that stays up; the
queues on a second Azurite (on-disk) that is stopped while the approval is due and restarted on the
same ports. The webhook receiver is stopped at the same time and restarted on its port.

Proves (docs/central.md): the failed queue send gives its claim back and the timer retries it, so the
approval arrives and is POSTed exactly once; the alert that failed is recorded `Sent=false`, retried
by the timer and delivered once; later alerts are delivered. The forwarder survives the queue outage.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List

import pytest
from azure.data.tables import TableServiceClient

from central.runtime.service import CentralService
from sandbox import processes
from tests import signing
from tests.forwarder.helpers import Forwarder, admin, imds_url, read_published, wait_until

ROUNDS = {"short": 1, "full": 4}  # outages, one event each
# Timer runs while storage and webhook are down (central retries an alert for 5 rounds in all).
OUTAGE_TIMER_CALLS = {"short": 1, "full": 3}


class Ingest:
    """Feeds the forwarder's new envelopes to central, as the Event Hubs trigger would."""

    def __init__(self, svc: CentralService, published: Path) -> None:
        self.svc = svc
        self.published = published
        self.seen = 0

    def pump(self) -> None:
        envelopes = read_published(self.published)
        new, self.seen = envelopes[self.seen:], len(envelopes)
        if new:
            self.svc.handle_batch([json.dumps(e) for e in new])

    def tick(self) -> None:
        self.pump()
        self.svc.reevaluate()


def alert_rows(storage: str, prefix: str) -> Dict[str, Dict[str, Any]]:
    table = TableServiceClient.from_connection_string(storage).get_table_client(f"{prefix}Alerts")
    return {e["Key"]: dict(e) for e in table.list_entities()}


def delivered(record: Path) -> List[str]:
    if not record.exists():
        return []
    return [json.loads(line)["body"].get("key", "") for line in record.read_text().splitlines() if line]


def posts_for(imds: processes.Server, event_id: str) -> int:
    return sum(event_id in (r.get("body") or "")
               for r in admin(imds, "GET", "/requests?method=POST&path=scheduledevents"))


@pytest.mark.parametrize("form", ["short", pytest.param("full", marks=pytest.mark.slow)])
def test_queue_and_webhook_outages_retry_and_lose_nothing(form: str, tmp_path: Path,
                                                          azurite: processes.Server) -> None:
    queues = processes.start_azurite(log_dir=tmp_path / "q", location=tmp_path / "q-data")
    imds = processes.start_imds(["--time-scale", "60"], log_dir=tmp_path)
    record = tmp_path / "alerts.jsonl"
    webhook = processes.start_webhook_receiver(["--record", str(record)], log_dir=tmp_path)
    table_port = azurite.ports["table"]
    storage = processes.azurite_connection_string(azurite.ports["blob"], queues.ports["queue"], table_port)
    prefix = "out" + uuid.uuid4().hex[:8]
    svc = signing.central({
        "ApprovalStorage": storage, "TABLE_PREFIX": prefix,
        "ALERT_WEBHOOK_URL": f"http://127.0.0.1:{webhook.port}/hook", "ALERT_WEBHOOK_FORMAT": "generic",
        "ALERT_MAX_ATTEMPTS": "2", "ALERT_BACKOFF_SECONDS": "0.05", "ALERT_TIMEOUT_SECONDS": "2",
        "STATUS_ALERT_MIN_SEVERITY": "info"})  # (a User event's alerts are info: posted for this test)
    hooks = tmp_path / "hooks"
    hooks.mkdir(mode=0o700)  # empty; the forwarder refuses a hook directory others can write
    published = tmp_path / "published.jsonl"
    fw = Forwarder(imds_url(imds), tmp_path / "state", published, extra=[
        "--approval-fast-interval", "0.5", "--approval-slow-interval", "2", "--hook-dir", str(hooks),
        "--local-event-types", ""], env={"SE_FORWARDER_QUEUE_CONNECTION_STRING": storage}).start()
    ingest = Ingest(svc, published)
    events: List[str] = []
    failed_rows: List[Dict[str, Any]] = []
    try:
        wait_until(lambda: [e for e in read_published(published) if e["type"].endswith("incarnation.v1")],
                   timeout=60, what="the first incarnation")
        ingest.pump()
        for _ in range(ROUNDS[form]):
            queues.stop()
            webhook.stop()
            # A user-initiated Reboot: the default policy approves it at once (action "approve").
            eid = str(admin(imds, "POST", "/events", {"eventType": "Reboot", "eventSource": "User",
                                                      "resources": ["vm0"], "noticeSeconds": 86400,
                                                      "startedSeconds": 60})["eventId"])
            events.append(eid)
            key = f"{eid}:Scheduled"
            wait_until(lambda key=key: (ingest.pump() or True) and key in alert_rows(storage, prefix),
                       timeout=60, what="central to see the event (and fail its alert)")
            for _ in range(OUTAGE_TIMER_CALLS[form]):
                ingest.tick()
                time.sleep(0.5)
            failed_rows.append(alert_rows(storage, prefix)[key])
            assert posts_for(imds, eid) == 0, "no approval can arrive while the queue is down"
            assert fw.alive(), "the forwarder survives the queue outage"
            queues = processes.start_azurite(log_dir=tmp_path / "q", location=tmp_path / "q-data",
                                             ports=queues.ports)
            webhook = processes.start_webhook_receiver(["--record", str(record)], log_dir=tmp_path,
                                                       port=webhook.port)
            wait_until(lambda eid=eid: ingest.tick() or posts_for(imds, eid) >= 1, timeout=90, step=0.5,
                       what="the approval POSTed after the queue returned")
            wait_until(lambda eid=eid: ingest.tick() or f"{eid}:Started" in delivered(record), timeout=60,
                       step=0.5, what="the Started alert delivered")
            wait_until(lambda key=key: ingest.tick() or key in delivered(record), timeout=30, step=0.5,
                       what="the failed Scheduled alert retried and delivered")
        for _ in range(4):  # a few more timer rounds: a second POST or alert would show now
            ingest.tick()
            time.sleep(0.5)
        assert fw.alive()
        final_rows = alert_rows(storage, prefix)
        posts = {eid: posts_for(imds, eid) for eid in events}
        assert fw.terminate() == 0
    finally:
        if fw.alive():
            fw.kill()
        webhook.stop()
        queues.stop()
        imds.stop()

    assert all(row["Sent"] is False for row in failed_rows), "the alert tried in the outage recorded failed"
    assert posts == {eid: 1 for eid in events}, "each approval POSTed exactly once"
    keys = delivered(record)
    for eid in events:
        assert keys.count(f"{eid}:Scheduled") == 1 and keys.count(f"{eid}:Started") == 1, keys
        assert final_rows[f"{eid}:Scheduled"]["Sent"] is True
    print(f"outages={len(events)} posts={posts} delivered={len(keys)}")
