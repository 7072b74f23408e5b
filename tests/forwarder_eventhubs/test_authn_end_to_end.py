"""End to end: the forwarder process with `--authenticate` publishes through the real azure-eventhub
producer to the sandbox hub; a real consumer reads the events with their application properties;
central/intake/authn.py authenticates every one, also as the sandbox Functions runner hands them over
(cardinality many: `metadata["PropertiesArray"][i]`)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator, List

import pytest
from azure.eventhub import EventHubConsumerClient

from central.intake import authn
from sandbox import processes
from sandbox.functions.eventhub import function_events
from schemas import authn as wire

from .helpers import HUB, admin, eh_forwarder, schedule, wait_until


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[dict]:
    imds = processes.start_imds(["--time-scale", "60", "--attestation-dir", str(tmp_path)], log_dir=tmp_path)
    hub = processes.start_eventhubs([f"{HUB}=2"], log_dir=tmp_path)
    yield {"imds": imds, "hub": hub, "trust": authn.load_trust((tmp_path / "trust.pem").read_text())}
    hub.stop()
    imds.stop()


def receive_all(connection_string: str, want: int, timeout: float = 30.0) -> List[Any]:
    """Raw EventData (properties included) from every partition, by a real consumer client."""
    got: List[Any] = []
    lock = threading.Lock()
    client = EventHubConsumerClient.from_connection_string(connection_string, consumer_group="$Default")

    def on_batch(context: Any, events: List[Any]) -> None:
        with lock:
            got.extend(events)

    thread = threading.Thread(target=client.receive_batch, daemon=True, kwargs={
        "on_event_batch": on_batch, "starting_position": "-1", "max_wait_time": 0.5})
    thread.start()
    try:
        wait_until(lambda: len(got) >= want, timeout=timeout, what=f"{want} events")
    finally:
        client.close()
        thread.join(10)
    return list(got)


def test_every_published_event_authenticates_as_its_vm(rig: dict, tmp_path: Path) -> None:
    connection = processes.eventhubs_connection_string(rig["hub"].port, HUB)
    forwarder = eh_forwarder(rig["imds"], tmp_path / "state", connection,
                             extra=["--authenticate", "--heartbeat-interval", "1"]).start()
    try:
        schedule(rig["imds"])
        events = receive_all(connection, want=4)
    finally:
        assert forwarder.terminate() == 0
    vm_id = admin(rig["imds"], "GET", "/vms/vm0")["vmId"]
    assert {e.body_as_json()["type"] for e in events} >= {"scheduledevents.incarnation.v1",
                                                          "scheduledevents.heartbeat.v1"}
    cache: dict = {}
    for event in events:
        body = b"".join(event.body)
        result = authn.verify(body, event.properties, rig["trust"], event.enqueued_time, vm_id, cache=cache)
        assert isinstance(result, authn.Authenticated), result
        assert result.vm_id == vm_id
    # The same events as the Functions runner gives them to function_app (cardinality many).
    handed = function_events(events, many=True)
    for i, event in enumerate(handed):
        props = event.metadata["PropertiesArray"][i]
        assert props[wire.PROP_KID] == events[i].properties[wire.PROP_KID.encode()].decode()
        assert authn.verify(event.get_body(), props, rig["trust"], event.enqueued_time, vm_id).ok
    # And a byte changed in transit (or by a relay) is caught.
    tampered = b"".join(events[0].body).replace(b'"specversion":"1.0"', b'"specversion":"1.1"')
    assert not authn.verify(tampered, events[0].properties, rig["trust"], events[0].enqueued_time, vm_id).ok


def test_no_authenticate_sends_events_without_authentication(rig: dict, tmp_path: Path) -> None:
    """Signing is the default on the Event Hubs sink (issue 22); turning it off is explicit."""
    connection = processes.eventhubs_connection_string(rig["hub"].port, HUB)
    forwarder = eh_forwarder(rig["imds"], tmp_path / "state", connection,
                             extra=["--heartbeat-interval", "1", "--no-authenticate"]).start()
    try:
        events = receive_all(connection, want=1)
    finally:
        assert forwarder.terminate() == 0
    vm_id = admin(rig["imds"], "GET", "/vms/vm0")["vmId"]
    first = events[0]
    result = authn.verify(b"".join(first.body), first.properties, rig["trust"], first.enqueued_time, vm_id)
    assert isinstance(result, authn.Rejected) and result.reason == "missing"
