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
        sink = sinks.make(config, limiter)
    except Exception:
        outbox.close()
        raise
    publisher = Publisher(outbox, sink)
    poller = Poller(client, outbox, on_put=publisher.wake)
    heartbeat = Heartbeat(poller, outbox, client, interval=config.heartbeat_interval)

    recovered = RecoveryBeat(outbox, heartbeat)

    def heartbeat_step(stop: threading.Event) -> None:
        if heartbeat.tick() or recovered.tick():
            publisher.wake()

    approvals = _approvals(config, client, outbox, poller, publisher, daemon)
    daemon.add_worker("poller", lambda stop: poller.poll_once(), interval=config.poll_interval)
    daemon.add_worker("publisher", publisher.step)
    daemon.add_worker("heartbeat", heartbeat_step, interval=min(1.0, config.heartbeat_interval))
    daemon.add_worker("approvals", approvals.step)
    daemon.on_close += [approvals.close]
    daemon.on_close += [lambda: publisher.flush(timeout=5.0), sink.close, outbox.close, client.close]
    return App(config, client, outbox, sink, poller, publisher, heartbeat, daemon)


class RecoveryBeat:
    """One extra heartbeat as soon as the sink is back and the backlog drained (docs/eventhub-sink.md),
    so the dropped count and the outage show centrally within seconds, not after the next interval.

    "Failing" is the outbox's persistent `last_error` (set on a failed send, cleared by a successful
    one), so an outage that spans a forwarder restart is reported too."""

    def __init__(self, outbox: Outbox, heartbeat: Heartbeat, drained_below: int = 10) -> None:
        self.outbox = outbox
        self.heartbeat = heartbeat
        self.drained_below = drained_below
        self._pending = outbox.last_error is not None

    def tick(self) -> bool:
        if self.outbox.last_error is not None:
            self._pending = True
            return False
        if not self._pending or self.outbox.backlog() >= self.drained_below:
            return False
        if self.heartbeat.beat():
            self._pending = False
            return True
        return False


def approval_settings(config: Config, limiter: Any = None) -> Any:
    """docs/approvals.md: the approval reader, hooks and fast path, from the settings table."""
    from . import hooks
    from .approvals.reader import ReaderSettings
    from .approvals.service import ApprovalSettings, poison_dir

    credential = None
    if config.queue_service_uri and not config.queue_connection_string:
        from .imds import managed_identity_credential

        # The queue's own identity (default: system-assigned, one per VM), not the hub's shared one.
        credential = managed_identity_credential(config.queue_client_id, limiter)
    return ApprovalSettings(
        state_dir=config.state_dir, queue_service_uri=config.queue_service_uri,
        queue_connection_string=config.queue_connection_string, credential=credential,
        reader=ReaderSettings(fast_interval=config.approval_fast_interval,
                              slow_interval=config.approval_slow_interval,
                              visibility_timeout=config.approval_visibility_timeout,
                              max_dequeue=config.approval_max_dequeue,
                              poison_queue=config.approval_poison_queue,
                              poison_dir=poison_dir(config.state_dir)),
        hooks=hooks.HookSettings(hook_dir=config.hook_dir, timeout_seconds=config.hook_timeout),
        local_event_types=tuple(config.local_event_types), local_approve=config.local_approve)


def _approvals(config: Config, client: ImdsClient, outbox: Outbox, poller: Poller, publisher: Publisher,
               daemon: Any) -> Any:
    from .approvals.service import ApprovalService

    service = ApprovalService(approval_settings(config, client.limiter), client, outbox,
                              poller.ensure_identity, wake_publisher=publisher.wake, stop=daemon.stop)
    poller.subscribers.append(service.subscriber)
    return service
