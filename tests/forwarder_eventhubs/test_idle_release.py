"""The publisher lets the Event Hubs connection go once nothing was sent for `release_after` seconds
(eventhub_idle_close), so an idle VM holds no connection to the namespace (5,000 per Standard
namespace); the next envelope opens a new one and arrives. Seen from the OS (the process's TCP
connections to the hub's port) and from a real consumer."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from forwarder.outbox import Outbox
from forwarder.publisher import Publisher
from forwarder.sinks.eventhub import EventHubSettings, EventHubSink
from sandbox import processes

from .helpers import Consumer, wait_until
from .test_sink import envelope


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[processes.Server]:
    srv = processes.start_eventhubs(["idle=2"], log_dir=tmp_path)
    yield srv
    srv.stop()


def connections_to(port: int) -> int:
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


@pytest.mark.parametrize("release_after", [0.5, 0.0])
def test_an_idle_sink_holds_no_connection_and_the_next_send_reopens_it(
        hub: processes.Server, tmp_path: Path, release_after: float) -> None:
    conn = processes.eventhubs_connection_string(hub.port, "idle")
    sink = EventHubSink(EventHubSettings(connection_string=conn))
    outbox = Outbox(tmp_path / "state")
    publisher = Publisher(outbox, sink, idle=0.1, release_after=release_after)
    stop = threading.Event()
    try:
        outbox.put(envelope("vm-a", 1))
        publisher.step(stop)
        assert connections_to(hub.port) == 1
        for _ in range(10):  # 1 s of idle steps
            publisher.step(stop)
        assert connections_to(hub.port) == (0 if release_after else 1)
        outbox.put(envelope("vm-a", 2))
        publisher.step(stop)
        assert connections_to(hub.port) == 1 and outbox.backlog() == 0
    finally:
        sink.close()
        outbox.close()
    consumer = Consumer(conn).start()
    try:
        wait_until(lambda: len(consumer.items()) >= 2, timeout=30, what="both envelopes")
        assert consumer.incarnations("vm-a") == [1, 2]
    finally:
        consumer.close()
