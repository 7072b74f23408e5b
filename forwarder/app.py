"""Wire the parts from a Config: client, outbox, poller, publisher, heartbeat, and the daemon's workers.

To add a worker: build it from `app` and call `app.daemon.add_worker(name, step, interval)` in
`build()`, plus any closer in `app.daemon.on_close`.

Nothing the configuration does not use is imported: the Event Hubs SDK only for the eventhub sink,
the managed-identity token client only when a managed identity is configured, the Storage queue SDK
only when the first approval may be waiting (approvals/service.py), the metrics server only with
`metrics_port`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional

from . import sinks
from .config import Config
from .heartbeat import Heartbeat
from .imds import ImdsClient, ImdsRejected, managed_identity_credential
from .imds_refusals import EXIT_IMDS_REFUSES, RefusalCounter
from .outbox import Outbox, StateError
from .poller import Poller
from .publisher import Publisher
from .ratelimit import RateLimiter

__all__ = ["App", "StateError", "Unusable", "approval_settings", "build", "hook_settings"]


class Unusable(Exception):
    """A configured local resource cannot be used (e.g. metrics_port is taken): exit 2."""


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
    approvals: Any = None
    extras: List[Any] = field(default_factory=list)


class SharedCredential:
    """One managed-identity credential for the sink and the queue, made when first asked for."""

    def __init__(self, client_id: str, limiter: RateLimiter, stop: Optional[threading.Event] = None) -> None:
        self._args = (client_id, limiter, stop)
        self._credential: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        with self._lock:
            if self._credential is None:
                self._credential = managed_identity_credential(*self._args)
            return self._credential

    def close(self) -> None:
        with self._lock:
            credential, self._credential = self._credential, None
        if credential is not None:
            credential.close()


def queue_identity(config: Config, limiter: RateLimiter, stop: Optional[threading.Event] = None,
                   hub: Optional[SharedCredential] = None) -> SharedCredential:
    """The approval queue's managed identity: `queue_client_id` (empty: the VM's system-assigned one,
    which the install scopes to this VM's own queue; docs/deploy.md), not the hub's shared one; the
    hub's credential itself when both name the same identity."""
    if hub is not None and config.queue_client_id == config.client_id:
        return hub
    return SharedCredential(config.queue_client_id, limiter, stop)


def build(config: Config) -> App:
    """Every part, opened and checked; raises StateError (exit 6) or SinkUnavailable (exit 2)."""
    from .daemon import Daemon

    daemon = Daemon()
    limiter = RateLimiter()  # the VM's one IMDS budget, shared with token calls (forwarder/credential.py)
    client = ImdsClient(config.imds_url, config.api_version, limiter=limiter, stop=daemon.stop)
    credential = SharedCredential(config.client_id, limiter, daemon.stop)
    queue_credential = queue_identity(config, limiter, daemon.stop, hub=credential)
    outbox = Outbox(Path(config.state_dir), max_rows=config.outbox_max_rows)
    try:
        sink = sinks.make(config, limiter, credential)
        publisher = Publisher(outbox, sink, release_after=config.eventhub_idle_close)
        poller = Poller(client, outbox, on_put=publisher.wake)
        heartbeat = Heartbeat(poller, outbox, client, interval=config.heartbeat_interval)
        approvals = _approvals(config, client, outbox, poller, publisher, daemon, queue_credential)
    except BaseException:
        outbox.close()
        raise
    recovered = RecoveryBeat(outbox, heartbeat)

    def heartbeat_step(stop: threading.Event) -> None:
        if heartbeat.tick() or recovered.tick():
            publisher.wake()

    app = App(config, client, outbox, sink, poller, publisher, heartbeat, daemon, approvals)
    daemon.add_worker("poller", poll_step(poller), interval=config.poll_interval)
    daemon.add_worker("publisher", publisher.step)
    daemon.add_worker("heartbeat", heartbeat_step, interval=min(1.0, config.heartbeat_interval))
    daemon.add_worker("approvals", approvals.step)
    if config.metrics_port:
        from .metrics import MetricsServer

        try:
            server = MetricsServer(app, config.metrics_port)
        except OSError as exc:
            outbox.close()
            raise Unusable(f"metrics_port {config.metrics_port}: cannot listen on 127.0.0.1 "
                           f"({exc.strerror or exc}); choose a free port or 0 (off)") from exc
        app.extras.append(server)
        daemon.on_close.append(server.close)
    daemon.on_close += [approvals.close]
    daemon.on_close += [lambda: publisher.flush(timeout=5.0), sink.close, outbox.close, client.close,
                        credential.close, queue_credential.close]
    return app


def poll_step(poller: Poller, refusals: Optional[RefusalCounter] = None) -> Callable[[threading.Event], None]:
    """The poller worker's step: one poll; the same non-healing refusal LIMIT times in a row ends `run`
    (exit 8) instead of retrying forever (forwarder/imds_refusals.py)."""
    from .daemon import Fatal

    counter = refusals or RefusalCounter()

    def step(stop: threading.Event) -> None:
        try:
            poller.poll_once()
        except ImdsRejected as exc:
            if counter.record(exc.status):
                raise Fatal(f"IMDS refused the configured request {counter.count} times in a row: {exc}. "
                            f"Not retrying: fix --imds-url / --api-version and start again "
                            f"(exit {EXIT_IMDS_REFUSES})", EXIT_IMDS_REFUSES) from exc
            raise
        except Exception:
            counter.record(None)
            raise
        counter.record(None)

    return step


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


def hook_settings(config: Config) -> Any:
    from .approvals.settings import HookSettings

    return HookSettings(hook_dir=config.hook_dir, timeout_seconds=config.hook_timeout)

def approval_settings(config: Config, limiter: Any = None, credential: Any = None) -> Any:
    """docs/approvals.md: the approval reader, hooks and fast path, from the settings table.
    `credential`: the queue's managed identity (or a callable making it) for queue_service_uri."""
    from .approvals.service import poison_dir
    from .approvals.settings import ApprovalSettings, ReaderSettings

    if config.queue_service_uri and credential is None:
        credential = queue_identity(config, limiter or RateLimiter())
    return ApprovalSettings(
        state_dir=config.state_dir, queue_service_uri=config.queue_service_uri,
        queue_connection_string=config.queue_connection_string,
        credential=credential if config.queue_service_uri else None,
        reader=ReaderSettings(fast_interval=config.approval_fast_interval,
                              slow_interval=config.approval_slow_interval,
                              visibility_timeout=config.approval_visibility_timeout,
                              max_dequeue=config.approval_max_dequeue,
                              poison_queue=config.approval_poison_queue,
                              poison_dir=poison_dir(config.state_dir)),
        hooks=hook_settings(config), local_event_types=tuple(config.local_event_types),
        local_approve=config.local_approve, require_hook=config.require_pre_approve_hook)


def _approvals(config: Config, client: ImdsClient, outbox: Outbox, poller: Poller, publisher: Publisher,
               daemon: Any, credential: Any) -> Any:
    from .approvals.service import ApprovalService

    service = ApprovalService(approval_settings(config, client.limiter, credential), client, outbox,
                              poller.ensure_identity, wake_publisher=publisher.wake, stop=daemon.stop)
    poller.subscribers.append(service.subscriber)
    return service
