"""Forwarder -> sandbox Event Hubs server -> a real EventHubConsumerClient: shared pieces."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from azure.eventhub import EventHubConsumerClient

from sandbox import processes
from tests.forwarder.helpers import Forwarder, admin, imds_url, wait_until

HUB = "scheduled-events"
INCARNATION = "scheduledevents.incarnation.v1"
HEARTBEAT = "scheduledevents.heartbeat.v1"
QUARANTINED = "scheduledevents.quarantined.v1"

__all__ = ["HUB", "Consumer", "Received", "admin", "current_incarnation", "eh_forwarder", "imds_url",
           "wait_until"]


@dataclass
class Received:
    partition: str
    sequence: int
    partition_key: Optional[str]
    content_type: Optional[str]
    envelope: Dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.envelope["type"])

    @property
    def vm_id(self) -> str:
        return str(self.envelope["partitionkey"])


class Consumer:
    """Real `EventHubConsumerClient`s receiving every partition from the start, in threads.

    One client per partition: the sync client's all-partition `receive` visits partitions in turn and
    each empty one costs a wait (~13 events/s over 4 partitions), too slow for these tests; one
    client per partition, each on its own connection, is how a low-latency sync reader is built.
    Stopped by `close()` (bounded).
    """

    def __init__(self, connection_string: str, consumer_group: str = "$Default") -> None:
        self._conn = connection_string
        self._group = consumer_group
        self.clients: List[EventHubConsumerClient] = []
        self.received: List[Received] = []
        self.errors: List[str] = []
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []

    def _client(self) -> EventHubConsumerClient:
        return EventHubConsumerClient.from_connection_string(
            self._conn, consumer_group=self._group, retry_total=3, retry_backoff_factor=0.2,
            retry_backoff_max=1.0)

    def start(self) -> Consumer:
        probe = self._client()
        try:
            partitions = probe.get_partition_ids()
        finally:
            probe.close()
        for pid in partitions:
            client = self._client()
            self.clients.append(client)
            thread = threading.Thread(target=client.receive, daemon=True, kwargs={
                "on_event": self._on_event, "on_error": self._on_error, "partition_id": pid,
                "starting_position": "-1"})
            thread.start()
            self._threads.append(thread)
        return self

    def _on_event(self, context: Any, event: Any) -> None:
        if event is None:
            return
        key = event.system_properties.get(b"x-opt-partition-key")
        item = Received(partition=context.partition_id, sequence=event.sequence_number,
                        partition_key=key.decode() if isinstance(key, bytes) else key,
                        content_type=event.content_type, envelope=json.loads(event.body_as_str()))
        with self._lock:
            self.received.append(item)

    def _on_error(self, context: Any, error: Exception) -> None:
        self.errors.append(f"{type(error).__name__}: {error}")

    def items(self, type_: Optional[str] = None, vm_id: Optional[str] = None) -> List[Received]:
        with self._lock:
            items = list(self.received)
        return [r for r in items
                if (type_ is None or r.type == type_) and (vm_id is None or r.vm_id == vm_id)]

    def incarnations(self, vm_id: Optional[str] = None) -> List[int]:
        """In receipt order, per partition sequence (the order the hub keeps)."""
        items = sorted(self.items(INCARNATION, vm_id), key=lambda r: (r.partition, r.sequence))
        return [r.envelope["data"]["incarnation"] for r in items]

    def close(self) -> None:
        closers = [threading.Thread(target=c.close, daemon=True) for c in self.clients]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(15)
        for thread in self._threads:
            thread.join(5)


def current_incarnation(imds: processes.Server, vm: str = "vm0") -> int:
    """The VM's incarnation from the admin API (outside the VM's IMDS rate limit and request log)."""
    return int(admin(imds, "GET", f"/vms/{vm}/document")["DocumentIncarnation"])


def eh_forwarder(imds: processes.Server, state_dir: Path, connection_string: str, vm: str = "vm0",
                 extra: Sequence[str] = ()) -> Forwarder:
    """The forwarder as a real process publishing to Event Hubs (the connection string via env, as a
    secret would be; `--sink eventhub` overrides the file sink the shared helper sets)."""
    return Forwarder(imds_url(imds, vm), state_dir, state_dir.parent / f"unused-{state_dir.name}.jsonl",
                     extra=["--sink", "eventhub", *extra],
                     env={"SE_FORWARDER_EVENTHUB_CONNECTION_STRING": connection_string})


def check_report(imds: processes.Server, state_dir: Path, connection_string: str, vm: str = "vm0") -> Dict:
    """`se-forwarder check` as a process: its JSON report."""
    config = state_dir.parent / "check-config.json"
    config.write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "forwarder", "check", "--json", "--config", str(config),
         "--imds-url", imds_url(imds, vm), "--state-dir", str(state_dir),
         "--eventhub-connection-string", connection_string],
        cwd=processes.REPO, capture_output=True, text=True, timeout=60)
    return dict(json.loads(proc.stdout))


def schedule(imds: processes.Server, vm: str = "vm0", event_type: str = "Freeze") -> str:
    body = {"eventType": event_type, "resources": [vm], "noticeSeconds": 3600}
    return str(admin(imds, "POST", "/events", body)["eventId"])


def change_and_wait_in_outbox(imds: processes.Server, forwarder: Forwarder, vm: str = "vm0") -> int:
    """Schedule an event; wait until the forwarder has the new incarnation in its state. Returns it."""
    schedule(imds, vm)
    want = current_incarnation(imds, vm)
    wait_until(lambda: last_incarnation(forwarder.state_dir) == want, timeout=20,
               what=f"{vm}: incarnation {want} in the outbox")
    return want


def last_incarnation(state_dir: Path) -> Optional[int]:
    import sqlite3

    db = state_dir / "outbox.sqlite3"
    if not db.exists():
        return None
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute("SELECT value FROM state WHERE key = 'last_incarnation'").fetchone()
    except sqlite3.OperationalError:
        return None
    finally:
        conn.close()
    return None if row is None else json.loads(row[0])


def wait_seconds(seconds: float) -> None:
    time.sleep(seconds)
