"""The real azure-eventhub async SDK (azure.eventhub.aio) against the sandbox Event Hubs server."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator, List, Optional, Set

import pytest
from azure.eventhub import EventData
from azure.eventhub.aio import EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.exceptions import EventHubError

from sandbox import processes


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    srv = processes.start_eventhubs(["live=2"], log_dir=tmp_path_factory.mktemp("eventhubs-aio"))
    yield srv
    srv.stop()


async def _live_round_trip(connection_string: str) -> List[Any]:
    """A consumer attached at @latest gets what a producer sends afterwards, keyed events in order."""
    # load_balancing_interval: the processor sleeps that long (default 30 s) before it notices close().
    consumer = EventHubConsumerClient.from_connection_string(connection_string, consumer_group="$Default",
                                                             load_balancing_interval=1)
    got: List[Any] = []
    ready, done = asyncio.Event(), asyncio.Event()
    started: Set[str] = set()

    async def on_event(context: Any, event: Optional[EventData]) -> None:
        started.add(context.partition_id)  # called with None after max_wait_time: that link is up
        if len(started) == 2:
            ready.set()
        if event is not None:
            got.append((context.partition_id, event))
            if len(got) >= 8:
                done.set()

    task = asyncio.ensure_future(consumer.receive(on_event=on_event, starting_position="@latest",
                                                  max_wait_time=0.3))
    try:
        await asyncio.wait_for(ready.wait(), 15)
        producer = EventHubProducerClient.from_connection_string(connection_string, retry_total=1)
        async with producer:
            props = await producer.get_eventhub_properties()
            assert props["partition_ids"] == ["0", "1"]
            for i in range(4):
                batch = await producer.create_batch(partition_key="vm-async")
                batch.add(EventData(f"k{i}"))
                await producer.send_batch(batch)
            batch = await producer.create_batch(partition_id="1")
            for i in range(4):
                batch.add(EventData(f"p{i}"))
            await producer.send_batch(batch)
            info = await producer.get_partition_properties("1")
            assert info["last_enqueued_sequence_number"] >= 3
        await asyncio.wait_for(done.wait(), 15)
    finally:
        await consumer.close()
        finished, _ = await asyncio.wait([task], timeout=10)
        if not finished:  # the SDK's receive() may outlive close(); do not leave it running
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return got


def test_async_producer_to_async_consumer(server: processes.Server) -> None:
    got = asyncio.run(_live_round_trip(processes.eventhubs_connection_string(server.port, "live")))
    keyed = [(pid, e) for pid, e in got if e.partition_key == b"vm-async"]
    assert [e.body_as_str() for _, e in keyed] == ["k0", "k1", "k2", "k3"]
    assert len({pid for pid, _ in keyed}) == 1
    assert [e.body_as_str() for pid, e in got if pid == "1" and e.partition_key is None] == [
        "p0", "p1", "p2", "p3"]


async def _unknown_hub(connection_string: str) -> str:
    async with EventHubProducerClient.from_connection_string(connection_string, retry_total=0) as producer:
        with pytest.raises(EventHubError) as caught:
            await producer.send_event(EventData("x"))
    return str(caught.value)


def test_async_unknown_hub_is_a_clear_error(server: processes.Server) -> None:
    message = asyncio.run(_unknown_hub(processes.eventhubs_connection_string(server.port, "missing")))
    assert "'missing' could not be found" in message
