"""The host's retry policies (fixedDelay, exponentialBackoff), applied to one invocation."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from .hostconfig import timespan_seconds

log = logging.getLogger("sandbox.functions")


class Stopped(Exception):
    """The runner is stopping: the invocation was not retried to completion (and is not checkpointed)."""


@dataclass(frozen=True)
class RetryPolicy:
    strategy: str = "none"
    max_retry_count: int = 0  # -1: retry until the runner stops, as the host does
    delay: float = 0.0
    minimum: float = 0.0
    maximum: float = 0.0

    @classmethod
    def from_mapping(cls, spec: Optional[Mapping[str, Any]]) -> RetryPolicy:
        """From host.json `retry` or a function's `@app.retry` (camelCase or snake_case keys)."""
        if not spec:
            return cls()

        def pick(*names: str) -> Any:
            return next((spec[n] for n in names if spec.get(n) is not None), None)

        strategy = str(pick("strategy") or "none").replace("_", "").lower()
        count = int(pick("maxRetryCount", "max_retry_count") or 0)
        if strategy == "fixeddelay":
            delay = timespan_seconds(pick("delayInterval", "delay_interval"), 0.0) or 0.0
            return cls("fixedDelay", count, delay=delay)
        if strategy == "exponentialbackoff":
            minimum = timespan_seconds(pick("minimumInterval", "minimum_interval"), 1.0) or 0.0
            maximum = timespan_seconds(pick("maximumInterval", "maximum_interval"), 900.0) or minimum
            return cls("exponentialBackoff", count, minimum=minimum, maximum=maximum)
        raise ValueError(f"unknown retry strategy {pick('strategy')!r} (fixedDelay | exponentialBackoff)")

    def delay_before(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        if self.strategy == "fixedDelay":
            return self.delay
        return min(self.maximum, self.minimum * (2 ** (retry - 1)))

    def run(self, invoke: Callable[[], Any], stop: threading.Event, what: str) -> Any:
        """Call `invoke` until it returns, the retries are used up (re-raise), or `stop` is set."""
        attempt = 0
        while True:
            try:
                return invoke()
            except Exception as exc:
                attempt += 1
                if self.strategy == "none" or (0 <= self.max_retry_count < attempt):
                    raise
                delay = self.delay_before(attempt)
                log.warning(
                    "%s failed (%s: %s); retry %d in %.1fs", what, type(exc).__name__, exc, attempt, delay
                )
                if stop.wait(delay):
                    raise Stopped(f"{what}: stopping during retries") from exc
