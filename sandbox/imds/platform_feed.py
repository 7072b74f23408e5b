"""Azure's side of the sandbox (issue 23, point 6): the fabric's own Scheduled Events feed.

Every transition of a simulated event (Scheduled, Started, Completed, Canceled) is published into the sandbox
Event Hubs as the Event Grid system topic `Microsoft.ResourceNotifications.MaintenanceResources` delivers it:
a JSON array holding one `ScheduledEventEmitted` event (facts in data.resourceInfo.properties, the owner's
ARM id in data.resourceInfo.id), partition key the EventId, through the real azure-eventhub SDK.

Faults, as Event Grid really behaves (at-least-once, unordered, late):
- duplicates: every event is sent twice with the same Event Grid id;
- reorder: each event is held back until the next one has been sent (or `hold` seconds pass);
- delay: each event waits this many seconds before it is sent.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import format_datetime
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .events import CANCELLED, SimEvent
from .identity import Identity

log = logging.getLogger("sandbox.imds.platform")
EMITTED = "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"
SAID = {CANCELLED: "Canceled"}  # the platform spells it with one "l"
_NAMESPACE = uuid.UUID("6f1c2a40-23a1-4e6e-9a11-2f6a3c9b1d23")


@dataclass
class FeedFaults:
    duplicates: bool = False
    reorder: bool = False
    delay: float = 0.0
    hold: float = 2.0  # reorder: the longest an event is held back waiting for the next one


def owner_id(identity: Optional[Identity], name: str, subscription: str, group: str) -> str:
    """The ARM id of the Compute resource that owns a VM's events: its scale set, else the VM."""
    if identity is not None:
        subscription, group = identity.subscriptionId, identity.resourceGroupName
    base = f"/subscriptions/{subscription}/resourceGroups/{group}/providers/Microsoft.Compute/"
    if identity is not None and identity.vmScaleSetName:
        return base + f"virtualMachineScaleSets/{identity.vmScaleSetName}"
    return base + f"virtualMachines/{name}"


def grid_event(event: SimEvent, at: float, identities: Mapping[str, Identity]) -> Dict[str, Any]:
    """One transition as the system topic emits it (platform-feed.md's sample shape)."""
    first = next((identities[r] for r in event.resources if r in identities), None)
    subscription = first.subscriptionId if first else "00000000-0000-0000-0000-000000000000"
    group = first.resourceGroupName if first else "sandbox"
    owner = owner_id(first, event.resources[0], subscription, group)
    rid = f"{owner}/providers/Microsoft.Maintenance/scheduledevents/{event.event_id}"
    not_before = ""
    if event.state == "Scheduled" and event.not_before is not None:
        not_before = format_datetime(datetime.fromtimestamp(event.not_before, timezone.utc), usegmt=True)
    said = SAID.get(event.state, event.state)
    return {
        "id": str(uuid.uuid5(_NAMESPACE, f"{event.event_id}/{said}")),
        "topic": f"/subscriptions/{subscription}",
        "subject": rid,
        "data": {
            "resourceInfo": {
                "id": rid, "name": event.event_id, "type": "microsoft.maintenance/scheduledEvents",
                "location": first.location if first else "eastus",
                "properties": {
                    "DurationInSeconds": event.duration_in_seconds, "Description": event.description,
                    "EventId": event.event_id, "EventSource": event.event_source, "EventStatus": said,
                    "EventType": event.event_type, "NotBefore": not_before,
                    "Resources": list(event.resources),
                    "ResourceType": "VirtualMachine", "ScheduledEventApiVersion": "2020-07-01",
                },
            },
            "apiVersion": "2024-07-01",
        },
        "eventType": EMITTED,
        "dataVersion": "3.0",
        "metadataVersion": "1",
        "eventTime": datetime.fromtimestamp(at, timezone.utc).isoformat().replace("+00:00", "Z"),
    }


class PlatformFeed:
    """Publishes the fabric's transitions (Fabric.listeners) from one background thread."""

    def __init__(self, connection_string: str, identities: List[Identity],
                 faults: Optional[FeedFaults] = None) -> None:
        from azure.eventhub import EventHubProducerClient

        self.producer = EventHubProducerClient.from_connection_string(connection_string)
        self.identities = {i.name: i for i in identities}
        self.faults = faults or FeedFaults()
        self.pending: queue.Queue[Optional[Tuple[float, Dict[str, Any]]]] = queue.Queue()
        self.sent = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="platform-feed", daemon=True)
        self._thread.start()

    def __call__(self, event: SimEvent, at: float) -> None:
        """Fabric listener: called under the fabric's lock, so it only queues. A made-up event (a VM's
        forwarder invented it) is never emitted: Azure never knew it."""
        if event.made_up:
            return
        self.pending.put((time.monotonic() + self.faults.delay, grid_event(event, at, self.identities)))

    def close(self, timeout: float = 5.0) -> None:
        self.pending.put(None)
        self._thread.join(timeout)
        self.producer.close()

    def _run(self) -> None:
        held: Optional[Dict[str, Any]] = None
        while True:
            try:
                item = self.pending.get(timeout=self.faults.hold if held is not None else None)
            except queue.Empty:
                self._send(held)  # nothing came to overtake it
                held = None
                continue
            if item is None:
                if held is not None:
                    self._send(held)
                return
            due, doc = item
            time.sleep(max(0.0, due - time.monotonic()))
            if self.faults.reorder and held is None:
                held = doc
                continue
            self._send(doc)
            if held is not None:
                self._send(held)  # sent after the one that came later
                held = None

    def _send(self, doc: Optional[Dict[str, Any]]) -> None:
        if doc is None:
            return
        key = doc["data"]["resourceInfo"]["name"]
        from azure.eventhub import EventData

        for _ in range(2 if self.faults.duplicates else 1):
            try:
                batch = self.producer.create_batch(partition_key=key)
                batch.add(EventData(json.dumps([doc])))
                self.producer.send_batch(batch)
                self.sent += 1
            except Exception as exc:  # noqa: BLE001 - the simulator keeps serving IMDS; the feed logs
                self.errors += 1
                log.error("platform feed: %s not sent: %s: %s", key, type(exc).__name__, exc)
