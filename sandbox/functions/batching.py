"""host.json's `minEventBatchSize` / `maxWaitTime` for one partition, as the Event Hubs extension does it.

The extension (Microsoft.Azure.WebJobs.Extensions.EventHubs, `EventHubListener.PartitionProcessor`
and `PartitionProcessorEventsManager`) is handed each partition's events as soon as the SDK reads them
(Azure.Messaging.EventHubs' AmqpConsumer.ReceiveAsync forms a batch at once from whatever is
available). It caches them; when the cache holds minEventBatchSize it invokes the function with up to
maxEventBatchSize. Otherwise the first event cached starts a timer: maxWaitTime later, whatever is
cached goes out as a partial batch. The first invocation of a partition after it is taken (start-up,
scaling) waits less: nothing, unless a checkpoint was written less than maxWaitTime ago (then the
remainder); here: nothing (this runner has just claimed the partition). Losing the partition drops
the cache (the new owner reads those events again from the checkpoint).

So an event waits at most maxWaitTime (plus the timer's precision) on top of its invocation, not the
receive loop's cadence: the runner formerly held events in the SDK's own `max_wait_time` window and
then again until the next wake-up of that loop, 2-3 x maxWaitTime, longer when one partition's
invocation stalled the loop every partition shares.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

Dispatch = Callable[[Any, List[Any]], None]


class PartitionBatcher:
    """One partition's cache. `receive(context, events)` on the receive thread; a timer thread flushes a
    partial batch. Invocations of one partition never overlap (the extension's semaphore)."""

    def __init__(self, min_size: int, max_size: int, max_wait: float, dispatch: Dispatch,
                 stop: threading.Event) -> None:
        self.min_size, self.max_size, self.max_wait = min_size, max(1, max_size), max(0.0, max_wait)
        self.dispatch = dispatch
        self.stop = stop
        self.held: List[Any] = []
        self.context: Any = None
        self.invoked = False  # the first invocation of the partition does not wait (see above)
        self.timer: Optional[threading.Timer] = None
        self._guard = threading.Lock()

    def receive(self, context: Any, events: List[Any]) -> None:
        with self._guard:
            self.context = context
            self.held.extend(events)
            while len(self.held) >= self.min_size and not self.stop.is_set():
                self._cancel()
                self._dispatch_one()
            if self.held and self.timer is None:
                self._arm(self.max_wait if self.invoked else 0.0)

    def close(self) -> None:
        """Ownership lost or shutting down: the held events are dropped (not checkpointed: read again), and
        the partition, when claimed again, starts as new (the extension makes a new partition processor)."""
        with self._guard:
            self._cancel()
            self.held = []
            self.invoked = False

    def _flush(self, timer: threading.Timer) -> None:
        with self._guard:
            if timer is not self.timer:
                return  # cancelled while it waited for the guard: a full batch went out meanwhile
            self.timer = None
            if self.held and not self.stop.is_set():
                self._dispatch_one()
            if self.held and not self.stop.is_set():
                self._arm(self.max_wait)

    def _dispatch_one(self) -> None:
        batch, self.held = self.held[: self.max_size], self.held[self.max_size :]
        self.invoked = True
        self.dispatch(self.context, batch)

    def _arm(self, seconds: float) -> None:
        timer = threading.Timer(seconds, lambda: self._flush(timer))
        timer.daemon = True
        timer.name = f"eventhub-wait-{getattr(self.context, 'partition_id', '?')}"
        self.timer = timer
        timer.start()

    def _cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
