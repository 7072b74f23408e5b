"""Wire the parts from a Config: client, outbox, poller, publisher, heartbeat, and the daemon's workers.

To add a worker (e.g. the approval reader): build it from `app` and call
`app.daemon.add_worker(name, step, interval)` in `build()`, plus any closer in `app.daemon.on_close`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import sinks
from .config import Config
from .heartbeat import Heartbeat
from .imds import ImdsClient
from .outbox import Outbox
from .poller import Poller
from .publisher import Publisher
from .ratelimit import RateLimiter


@dataclass
class App:
    config: Config
    client: ImdsClient
    outbox: Outbox
    sink: Any
    poller: Poller
    publisher: Publisher
    heartbeat: Heartbeat
    daemon: Any


def build(config: Config) -> App:
    from .daemon import Daemon

    daemon = Daemon()
    limiter = RateLimiter()  # the VM's one IMDS budget; share it with token calls (RateLimitedCredential)
    client = ImdsClient(config.imds_url, config.api_version, limiter=limiter, stop=daemon.stop)
    outbox = Outbox(Path(config.state_dir), max_rows=config.outbox_max_rows)
    try:
        sink = sinks.make(config)
    except Exception:
        outbox.close()
        raise
    publisher = Publisher(outbox, sink)
    poller = Poller(client, outbox, on_put=publisher.wake)
    heartbeat = Heartbeat(poller, outbox, client, interval=config.heartbeat_interval)

    def heartbeat_step(stop: threading.Event) -> None:
        if heartbeat.tick():
            publisher.wake()

    daemon.add_worker("poller", lambda stop: poller.poll_once(), interval=config.poll_interval)
    daemon.add_worker("publisher", publisher.step)
    daemon.add_worker("heartbeat", heartbeat_step, interval=min(1.0, config.heartbeat_interval))
    daemon.on_close += [lambda: publisher.flush(timeout=5.0), sink.close, outbox.close, client.close]
    return App(config, client, outbox, sink, poller, publisher, heartbeat, daemon)
