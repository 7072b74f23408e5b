"""The real azure-eventhub SDK (sync) against the sandbox Event Hubs server, over real sockets.

One server for the module; each test uses its own hub so the tests stay independent.
"""

from __future__ import annotations

import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.exceptions import EventHubError
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
from azure.storage.blob import BlobServiceClient

from sandbox import processes

HUBS = ["basic=2", "keys=4", "parts=2", "positions=1", "groups=2:analytics", "batches=1", "props=2",
        "latest=1", "big=1", "ckpt=1", "refused=1"]


# Closing a consumer client takes the SDK ~1.4 s; tests hand that to a thread and the module joins them.
_CLOSING: List[threading.Thread] = []


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    srv = processes.start_eventhubs(HUBS, log_dir=tmp_path_factory.mktemp("eventhubs"))
    yield srv
    for thread in _CLOSING:
        thread.join(20)
    srv.stop()


def conn(server: processes.Server, hub: str) -> str:
    return processes.eventhubs_connection_string(server.port, hub)


def producer(server: processes.Server, hub: str) -> EventHubProducerClient:
    return EventHubProducerClient.from_connection_string(conn(server, hub), retry_total=1)


def send(server: processes.Server, hub: str, bodies: List[str], **batch_args: Any) -> None:
    with producer(server, hub) as client:
        batch = client.create_batch(**batch_args)
        for body in bodies:
            batch.add(EventData(body))
        client.send_batch(batch)


class Receiver:
    """Runs the blocking `EventHubConsumerClient.receive` in a thread, bounded in count and time."""

    def __init__(self, connection_string: str, *, consumer_group: str = "$Default",
                 checkpoint_store: Any = None, retry_total: int = 1, **receive_args: Any) -> None:
        # load_balancing_interval: the processor sleeps that long (default 30 s) between checks of close().
        extra: Dict[str, Any] = {"load_balancing_interval": 1}
        if checkpoint_store is not None:
            extra.update(checkpoint_store=checkpoint_store, partition_ownership_expiration_interval=3)
        self.client = EventHubConsumerClient.from_connection_string(
            connection_string, consumer_group=consumer_group, retry_total=retry_total, **extra)
        self.events: List[EventData] = []
        self.partition_ids: List[str] = []  # the partition each event came from, in step with events
        self.errors: List[Exception] = []
        self.ready = threading.Event()  # the SDK calls on_event(None) once a link waited max_wait_time
        self._want = 0
        self._enough = threading.Event()
        self._checkpoint = checkpoint_store is not None
        args = {"max_wait_time": 0.3, "starting_position": "-1", **receive_args}
        callbacks = {"on_event": self._on_event, "on_error": self._on_error}
        self._thread = threading.Thread(target=self.client.receive, daemon=True, kwargs={**callbacks, **args})

    def _on_event(self, context: Any, event: Optional[EventData]) -> None:
        self.ready.set()
        if event is None:
            return
        self.partition_ids.append(context.partition_id)
        self.events.append(event)
        if self._checkpoint:
            context.update_checkpoint(event)
        if len(self.events) >= self._want:
            self._enough.set()

    def _on_error(self, context: Any, error: Exception) -> None:
        self.errors.append(error)
        self._enough.set()

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def wait(self, count: int, timeout: float = 15.0) -> List[EventData]:
        self._want = count
        deadline = time.monotonic() + timeout
        while len(self.events) < count and not self.errors and time.monotonic() < deadline:
            self._enough.clear()
            if len(self.events) < count:
                self._enough.wait(min(0.5, max(deadline - time.monotonic(), 0)))
        return list(self.events)

    def close(self) -> None:
        self.client.close()
        self._thread.join(15)

    def close_later(self) -> None:
        closer = threading.Thread(target=self.close, daemon=True)
        closer.start()
        _CLOSING.append(closer)


def receive_many(connection_string: str, wants: List[Dict[str, Any]],
                 timeout: float = 15.0) -> List[List[EventData]]:
    """Several receivers at once (the SDK's own start-up sleeps overlap); each dict: count + receive args."""
    receivers = [(w.pop("count"), Receiver(connection_string, **w).start()) for w in wants]
    try:
        return [r.wait(count, timeout) for count, r in receivers]
    finally:
        for _, r in receivers:
            r.close_later()


def receive(connection_string: str, count: int, timeout: float = 15.0, **kwargs: Any) -> List[EventData]:
    receiver = Receiver(connection_string, **kwargs).start()
    try:
        return receiver.wait(count, timeout)
    finally:
        receiver.close_later()


def bodies(events: List[EventData]) -> List[str]:
    return [e.body_as_str() for e in events]


# ---- tests ---------------------------------------------------------------------------------------

def test_sync_producer_to_sync_consumer(server: processes.Server) -> None:
    sent = [f"event-{i}-{uuid.uuid4()}" for i in range(10)]
    with producer(server, "basic") as client:
        for body in sent[:5]:
            client.send_event(EventData(body))  # round robin over the partitions
        batch = client.create_batch()
        for body in sent[5:]:
            batch.add(EventData(body))
        client.send_batch(batch)
    events = receive(conn(server, "basic"), len(sent))
    assert sorted(bodies(events)) == sorted(sent)
    for event in events:
        assert event.sequence_number is not None and event.offset == str(event.sequence_number)
        assert event.enqueued_time is not None and event.enqueued_time.year >= 2024
    assert {e.partition_key for e in events} == {None}


def test_partition_key_keeps_one_partition_in_order(server: processes.Server) -> None:
    with producer(server, "keys") as client:
        for round_ in range(3):
            for vm in ("vm-a", "vm-b", "vm-c"):
                batch = client.create_batch(partition_key=vm)
                batch.add(EventData(f"{vm}:{round_}"))
                client.send_batch(batch)
    receiver = Receiver(conn(server, "keys")).start()
    try:
        events = receiver.wait(9)
    finally:
        receiver.close_later()
    by_key: Dict[bytes, List[Any]] = {}
    for event, partition_id in zip(events, receiver.partition_ids):
        by_key.setdefault(event.partition_key, []).append((partition_id, event))
    assert sorted(by_key) == [b"vm-a", b"vm-b", b"vm-c"]
    for key, pairs in by_key.items():
        assert len({pid for pid, _ in pairs}) == 1, f"{key!r} spread over partitions"
        assert [e.body_as_str() for _, e in pairs] == [f"{key.decode()}:{r}" for r in range(3)]  # in order


def test_send_to_a_partition(server: processes.Server) -> None:
    with producer(server, "parts") as client:
        batch = client.create_batch(partition_id="1")
        batch.add(EventData("p1-a"))
        batch.add(EventData("p1-b"))
        client.send_batch(batch)
        assert bodies(receive(conn(server, "parts"), 2, partition_id="1")) == ["p1-a", "p1-b"]
        assert client.get_partition_properties("0")["is_empty"] is True
        assert client.get_partition_properties("1")["last_enqueued_sequence_number"] == 1


def test_hub_and_partition_properties(server: processes.Server) -> None:
    with producer(server, "props") as client:
        batch = client.create_batch(partition_id="0")
        for body in ("x", "y", "z"):
            batch.add(EventData(body))
        client.send_batch(batch)
        hub = client.get_eventhub_properties()
        assert hub["eventhub_name"] == "props" and hub["partition_ids"] == ["0", "1"]
        assert abs(time.time() - hub["created_at"].timestamp()) < 3600
        p0 = client.get_partition_properties("0")
        assert (p0["id"], p0["beginning_sequence_number"], p0["last_enqueued_sequence_number"]) == ("0", 0, 2)
        assert p0["last_enqueued_offset"] == "2" and p0["is_empty"] is False
        assert abs(time.time() - p0["last_enqueued_time_utc"].timestamp()) < 60
        p1 = client.get_partition_properties("1")
        assert p1["is_empty"] is True and p1["last_enqueued_sequence_number"] == -1
        with pytest.raises(EventHubError, match="Partition '7' does not exist"):
            client.get_partition_properties("7")


def test_starting_positions(server: processes.Server) -> None:
    cs = conn(server, "positions")
    send(server, "positions", [f"first-{i}" for i in range(4)])  # sequence numbers 0..3
    with producer(server, "positions") as client:
        boundary = client.get_partition_properties("0")["last_enqueued_time_utc"]
    time.sleep(0.02)  # enqueued times are milliseconds: the next batch is strictly later
    send(server, "positions", [f"second-{i}" for i in range(2)])  # 4..5
    everything = [f"first-{i}" for i in range(4)] + ["second-0", "second-1"]
    got = receive_many(cs, [
        {"count": 6, "starting_position": "-1"},
        {"count": 4, "starting_position": "1"},  # an offset, exclusive
        {"count": 4, "starting_position": 2, "starting_position_inclusive": True},  # a sequence number
        {"count": 3, "starting_position": 2},
        {"count": 2, "starting_position": boundary},  # an enqueued time
    ])
    assert [bodies(g) for g in got] == [everything, everything[2:], everything[2:], everything[3:],
                                        everything[4:]]


def test_latest_gets_only_new_events_while_attached(server: processes.Server) -> None:
    send(server, "latest", ["old"])
    receiver = Receiver(conn(server, "latest"), starting_position="@latest").start()
    try:
        assert receiver.ready.wait(15), "the consumer never started"
        send(server, "latest", ["new-1", "new-2"])
        assert bodies(receiver.wait(2)) == ["new-1", "new-2"]
    finally:
        receiver.close()


def test_consumer_groups_are_independent(server: processes.Server) -> None:
    sent = [f"g{i}" for i in range(6)]
    send(server, "groups", sent)
    cs = conn(server, "groups")
    first, second = receive_many(cs, [{"count": 6, "consumer_group": "$Default"},
                                      {"count": 6, "consumer_group": "analytics"}])
    assert sorted(bodies(first)) == sorted(sent) and sorted(bodies(second)) == sorted(sent)
    # An undeclared group is refused with a clear not-found error, not a hang (the SDK retries a
    # refused link within one receive call, so without retries the error reaches on_error at once).
    receiver = Receiver(cs, consumer_group="nope", partition_id="0", retry_total=0).start()
    try:
        receiver.wait(1, timeout=15)
        assert receiver.errors, "expected an error for an undeclared consumer group"
        assert "Consumer group 'nope' does not exist" in str(receiver.errors[0])
    finally:
        receiver.close()


def test_batches_and_multi_frame_messages(server: processes.Server) -> None:
    envelope = "x" * 2048
    many = [f"{i:04d}{envelope}" for i in range(200)]  # ~400 KB: the SDK splits the batch across frames
    with producer(server, "batches") as client:
        for start in range(0, len(many), 100):
            batch = client.create_batch()
            for body in many[start:start + 100]:
                batch.add(EventData(body))
            client.send_batch(batch)
        huge = "H" * 300_000  # one event larger than a frame, both directions
        client.send_event(EventData(huge))
    events = receive(conn(server, "batches"), 201, prefetch=25)  # credit is topped up many times
    assert bodies(events) == [*many, huge]
    assert [e.sequence_number for e in events] == list(range(201))


def test_application_properties_survive(server: processes.Server) -> None:
    event = EventData("with-props")
    event.properties = {"vmId": "1234", "n": 7}
    event.content_type = "application/cloudevents+json"
    with producer(server, "big") as client:
        client.send_event(event)
    (got,) = receive(conn(server, "big"), 1)
    assert got.properties[b"vmId"] == b"1234" and got.properties[b"n"] == 7
    assert got.content_type == "application/cloudevents+json"


def test_a_property_the_server_cannot_read_is_refused_and_the_link_stays_up(server: processes.Server) -> None:
    """A decimal128 property: the SDK's decoder (which the server uses) overflows on what its encoder
    wrote. The send is refused with amqp:decode-error; nothing is stored; the next send goes through."""
    event = EventData("decimal")
    event.properties = {"amount": Decimal("12.5")}
    client = EventHubProducerClient.from_connection_string(conn(server, "refused"), retry_total=0)
    with client:
        with pytest.raises(EventHubError, match="could not read the message"):
            client.send_event(event, partition_id="0")
        client.send_event(EventData("after"), partition_id="0")
    assert bodies(receive(conn(server, "refused"), 2, timeout=5)) == ["after"]


def test_unknown_hub_is_a_clear_error(server: processes.Server) -> None:
    client = EventHubProducerClient.from_connection_string(conn(server, "no-such-hub"), retry_total=0)
    with client:
        with pytest.raises(EventHubError, match="no-such-hub"):
            client.get_eventhub_properties()
        with pytest.raises(EventHubError, match="could not be found"):
            client.send_event(EventData("lost?"), partition_id="0")


def test_checkpointing_consumer_resumes_after_its_checkpoint(server: processes.Server,
                                                             azurite: processes.Server) -> None:
    storage = azurite.extra["connection_string"]  # the full string: the store rejects UseDevelopmentStorage
    container = f"checkpoints-{uuid.uuid4().hex[:8]}"
    with BlobServiceClient.from_connection_string(storage) as blobs:
        blobs.create_container(container)
    cs = conn(server, "ckpt")
    send(server, "ckpt", [f"c{i}" for i in range(3)])
    store = BlobCheckpointStore.from_connection_string(storage, container)
    first = Receiver(cs, checkpoint_store=store).start()
    try:
        assert bodies(first.wait(3)) == ["c0", "c1", "c2"]  # each one checkpointed as it arrives
    finally:
        first.close()
        store.close()  # its keep-alive connections would hold Azurite's shutdown for 10 s
    send(server, "ckpt", [f"c{i}" for i in range(3, 6)])
    # A new consumer in the same group: "-1" applies only where no checkpoint exists, so it resumes at c3.
    store = BlobCheckpointStore.from_connection_string(storage, container)
    second = Receiver(cs, checkpoint_store=store, starting_position="-1").start()
    try:
        assert bodies(second.wait(3, timeout=20)) == ["c3", "c4", "c5"]
    finally:
        second.close()
        store.close()


def test_restart_with_data_dir_keeps_events(tmp_path: Path) -> None:
    port = processes.free_port()
    argv = {"hubs": ["durable=2"], "port": port, "log_dir": tmp_path,
            "args": ["--data-dir", str(tmp_path / "d")]}
    srv = processes.start_eventhubs(**argv)
    try:
        with producer(srv, "durable") as client:
            batch = client.create_batch(partition_key="vm-1")
            for i in range(4):
                batch.add(EventData(f"before-{i}"))
            client.send_batch(batch)
            client.send_event(EventData("other"), partition_id="0")
        srv.kill()  # a crash: what was acknowledged was fsync'd first
        srv = processes.start_eventhubs(**argv)
        send(srv, "durable", ["after"], partition_key="vm-1")
        receiver = Receiver(conn(srv, "durable")).start()
        try:
            events = receiver.wait(6)
        finally:
            receiver.close()
        keyed = [e for e in events if e.partition_key == b"vm-1"]
        assert bodies(keyed) == [*(f"before-{i}" for i in range(4)), "after"]
        numbers = [e.sequence_number for e in keyed]
        assert numbers == sorted(set(numbers)) and numbers[0] == 0  # numbering continues after the restart
        assert "other" in bodies(events)
    finally:
        srv.stop()
