"""Publish and consume throughput of the sandbox Event Hubs server through the real azure-eventhub SDK.

`python -m bench.eventhubs_throughput [--count 5000] [--size 2048] [--partitions 4] [--vms 50]`
Starts the server, publishes COUNT envelopes of ~SIZE bytes in batches keyed by VM (as the forwarder does),
then reads them all back with one consumer, and prints envelopes/s for both. Bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections import defaultdict
from typing import Any, Dict, List, Optional

from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient

from bench import Figure, record
from sandbox import processes

HUB = "bench"


def envelope(vm: int, n: int, size: int) -> str:
    """A CloudEvents-shaped envelope padded to about `size` bytes."""
    doc: Dict[str, Any] = {
        "specversion": "1.0", "type": "scheduledevents.incarnation.v1",
        "source": f"/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm{vm}",
        "subject": f"vm{vm}", "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"vm{vm}/{n}")),
        "time": "2026-01-01T00:00:00Z", "datacontenttype": "application/json", "partitionkey": f"vm-{vm}",
        "data": {"incarnation": n, "document": {"DocumentIncarnation": n, "Events": []}, "pad": ""},
    }
    doc["data"]["pad"] = "x" * max(size - len(json.dumps(doc)), 0)
    return json.dumps(doc)


def publish(connection_string: str, count: int, size: int, vms: int, deadline: float) -> float:
    """Send `count` envelopes, each VM's in its own batches (partition key = VM); returns seconds taken."""
    per_vm: Dict[int, List[str]] = defaultdict(list)
    for n in range(count):
        per_vm[n % vms].append(envelope(n % vms, n, size))
    with EventHubProducerClient.from_connection_string(connection_string) as producer:
        producer.get_eventhub_properties()  # connect before the clock starts
        start = time.perf_counter()
        for vm, bodies in per_vm.items():
            batch = producer.create_batch(partition_key=f"vm-{vm}")
            for body in bodies:
                try:
                    batch.add(EventData(body))
                except ValueError:  # the batch is full (1 MB): send it and start another
                    producer.send_batch(batch)
                    batch = producer.create_batch(partition_key=f"vm-{vm}")
                    batch.add(EventData(body))
                if time.monotonic() > deadline:
                    raise TimeoutError("publishing took longer than the time limit")
            producer.send_batch(batch)
        return time.perf_counter() - start


def consume(connection_string: str, partitions: int, count: int, deadline: float) -> Optional[float]:
    """Read everything from the start; seconds from the first to the last event, None if incomplete.

    One client per partition, as a scaled-out reader would run: the sync SDK's single client shares one
    connection between its partition threads, and an idle partition's thread then blocks the socket
    read of the busy ones for its read timeout (0.2 s) per event; that would measure the SDK, not the hub.
    """
    clients = [EventHubConsumerClient.from_connection_string(connection_string, consumer_group="$Default",
                                                             load_balancing_interval=1)
               for _ in range(partitions)]
    lock = threading.Lock()
    seen = 0
    first: List[float] = []
    done = threading.Event()

    def on_event(_: Any, event: Optional[EventData]) -> None:
        nonlocal seen
        if event is None:
            return
        with lock:
            if not first:
                first.append(time.perf_counter())
            seen += 1
            if seen >= count:
                done.set()

    threads = [threading.Thread(target=client.receive, daemon=True, kwargs={
        "on_event": on_event, "starting_position": "-1", "max_wait_time": 1, "partition_id": str(pid)})
        for pid, client in enumerate(clients)]
    for thread in threads:
        thread.start()
    done.wait(max(deadline - time.monotonic(), 0))
    end = time.perf_counter()
    for client in clients:
        client.close()
    for thread in threads:
        thread.join(15)
    if seen < count or not first:
        print(f"consumed only {seen} of {count} before the time limit")
        return None
    return end - first[0]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eventhubs_throughput", description=__doc__)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--size", type=int, default=2048, help="approximate envelope size in bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--vms", type=int, default=50, help="distinct partition keys")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds for the whole run")
    args = parser.parse_args(argv)
    if not 1 <= args.count <= 200_000:
        parser.error("--count must be 1..200000")
    deadline = time.monotonic() + args.time_limit
    server = processes.start_eventhubs([f"{HUB}={args.partitions}"])
    try:
        cs = processes.eventhubs_connection_string(server.port, HUB)
        sent_s = publish(cs, args.count, args.size, args.vms, deadline)
        read_s = consume(cs, args.partitions, args.count, deadline)
    finally:
        server.stop()
    size = len(envelope(0, 0, args.size))
    print(f"Event Hubs sandbox throughput: {args.count} envelopes of {size} B, {args.partitions} partitions, "
          f"{args.vms} partition keys, azure-eventhub sync SDK")
    print(f"  published: {args.count / sent_s:,.0f} envelopes/s ({sent_s:.2f} s, "
          f"{args.count * size / sent_s / 1e6:.1f} MB/s)")
    figures = [Figure("eventhubs_throughput", f"published through the real SDK ({size} B envelopes)",
                      round(args.count / sent_s), "envelopes/s")]
    if read_s is not None:
        print(f"  consumed:  {args.count / read_s:,.0f} envelopes/s ({read_s:.2f} s, first to last event)")
        figures.append(Figure("eventhubs_throughput", "consumed through the real SDK",
                              round(args.count / read_s), "envelopes/s"))
    record(figures)
    return 0 if read_s is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
