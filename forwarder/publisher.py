"""The drain loop: peek a batch from the outbox -> sink.send -> ack only after success.

A failed send keeps the batch (it is retried, in order, with jittered backoff up to `max_delay`);
an empty outbox waits for `wake()` or `idle` seconds, so the loop never spins.

`release_after`: a sink that holds a connection (Event Hubs) is told to let it go once nothing was sent
for that many seconds; the next send opens a new one. At a 60 s heartbeat a VM then holds a connection
about a third of the time, so one Standard namespace (5,000 connections) serves ~14,000 VMs, not 5,000.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from . import logs
from .backoff import Backoff
from .outbox import Outbox
from .sinks.base import Sink, SinkError

log = logs.get("publisher")


class Publisher:
    def __init__(self, outbox: Outbox, sink: Sink, batch: int = 100, idle: float = 1.0,
                 max_delay: float = 30.0, release_after: float = 0.0) -> None:
        self.outbox = outbox
        self.sink = sink
        self.batch = batch
        self.idle = idle
        self.release_after = release_after  # 0: keep the sink's connection
        self._last_sent: Optional[float] = None
        self.backoff = Backoff(base=0.5, cap=max_delay)
        self._wake = threading.Event()

    def wake(self) -> None:
        """Something was put: drain now instead of at the next idle tick."""
        self._wake.set()

    def drain_once(self) -> int:
        """Send one batch. Returns how many were acknowledged (0 if empty). Raises SinkError."""
        items = self.outbox.peek(self.batch)
        if not items:
            return 0
        self.sink.send([item.envelope for item in items])
        self._last_sent = time.monotonic()
        self.outbox.ack([item.seq for item in items])
        log.info("sent", extra=logs.fields(count=len(items), sink=self.sink.name,
                                           ids=[i.id for i in items][:10]))
        return len(items)

    def step(self, stop: threading.Event) -> None:
        """One iteration of the worker loop: drain, or wait (idle / backoff). Never busy-loops."""
        try:
            sent = self.drain_once()
        except SinkError as exc:
            delay = self.backoff.delay_after(getattr(exc, "retry_after", None))
            self.outbox.record_error(str(exc))
            log.warning("send failed; keeping the batch", extra=logs.fields(
                error=str(exc), retryIn=round(delay, 2), sink=self.sink.name))
            stop.wait(max(0.05, delay))
            return
        self.backoff.reset()
        if sent == 0:
            self._release_if_idle()
            self._wake.wait(self.idle)
            self._wake.clear()

    def _release_if_idle(self) -> None:
        release = getattr(self.sink, "release", None)
        if (release is None or not self.release_after or self._last_sent is None
                or time.monotonic() - self._last_sent < self.release_after):
            return
        self._last_sent = None  # released until the next send
        release()

    def flush(self, timeout: float = 5.0, stop: Optional[threading.Event] = None) -> None:
        """On shutdown: try to send what is pending, bounded by `timeout`; what is left stays durable."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.drain_once() == 0:
                    return
            except SinkError as exc:
                self.outbox.record_error(str(exc))
                log.warning("flush on shutdown failed; kept in the outbox", extra=logs.fields(error=str(exc)))
                return
