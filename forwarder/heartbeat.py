"""A heartbeat envelope every N seconds: the forwarder is alive, what it last saw, how its outbox is."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from . import __version__, envelope, logs
from .clock import iso
from .imds import ImdsClient
from .outbox import Outbox
from .poller import Poller

log = logs.get("heartbeat")


class Heartbeat:
    def __init__(self, poller: Poller, outbox: Outbox, client: ImdsClient, interval: float = 60.0,
                 started_at: Optional[str] = None, version: str = __version__) -> None:
        self.interval = interval
        self._last: Optional[float] = None
        self.poller = poller
        self.outbox = outbox
        self.client = client
        self.started_at = started_at or iso()
        self.version = version

    def build(self) -> Optional[Dict[str, Any]]:
        """The heartbeat envelope, or None before the VM identity is known."""
        vm = self.poller.identity
        if vm is None:
            return None
        return envelope.heartbeat(vm, self.version, self.started_at, self.poller.last_incarnation,
                                  self.poller.scheduled_event_ids(), self.outbox.stats(),
                                  self.client.health.as_dict())

    def tick(self) -> bool:
        """Beat if one is due (the first as soon as the identity is known). True if one was put."""
        now = time.monotonic()
        if self._last is not None and now - self._last < self.interval:
            return False
        if self.poller.identity is None:
            return False
        self._last = now
        return self.beat()

    def beat(self) -> bool:
        env = self.build()
        if env is None:
            log.info("no heartbeat yet: VM identity unknown (IMDS not answered)")
            return False
        self.outbox.put(env)
        log.debug("heartbeat", extra=logs.fields(id=env["id"], backlog=env["data"]["outbox"]["backlog"]))
        return True
