"""The asyncio TCP server: one Connection per client, loopback only."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Optional, Set

from .capture import Capture
from .connection import Connection
from .rest import RestFront, serve_http
from .store import Broker

log = logging.getLogger("sandbox.eventhubs")
LOOPBACK = "127.0.0.1"


async def serve(broker: Broker, port: int, host: str = LOOPBACK, capture: Optional[Capture] = None,
                http_port: Optional[int] = None) -> None:
    """Serve until SIGTERM/SIGINT, then close every connection, flush Capture's open windows (if on) and
    close the partition files."""
    connections: Set[asyncio.Task] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await Connection(reader, writer, broker).run()
        except asyncio.CancelledError:
            pass  # shutting down
        finally:
            connections.discard(task)

    server = await asyncio.start_server(handle, host, port)
    http = None
    if http_port is not None:  # the REST send endpoint (sandbox/eventhubs/rest.py), same broker
        front = RestFront(broker)
        http = await asyncio.start_server(lambda r, w: serve_http(front, r, w), host, http_port)
        print(f"REST listening on {host}:{http.sockets[0].getsockname()[1]}", flush=True)
    port = server.sockets[0].getsockname()[1]  # the real one when 0 was asked for
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    hubs = ", ".join(f"{h.name}({len(h.partitions)})" for h in broker.hubs.values())
    log.info("Event Hubs sandbox listening on %s:%d, hubs: %s", host, port, hubs)
    print(f"listening on {host}:{port} hubs: {hubs}", flush=True)
    capturing = asyncio.create_task(capture.run(stop)) if capture is not None else None
    async with server:
        await stop.wait()
        server.close()
        if http is not None:
            http.close()
        for task in list(connections):
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
    if capturing is not None:
        await capturing
    broker.close()
    log.info("stopped")
