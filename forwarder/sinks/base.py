"""The sink protocol: where the outbox drains to (file/stdout now, Event Hubs later)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol


class SinkError(Exception):
    """The batch was not (certainly) delivered; the publisher keeps it and retries with backoff.

    `retryable=False` says retrying cannot help without an operator (e.g. bad configuration); the
    publisher still keeps the envelopes and retries slowly, since nothing may be lost.
    """

    def __init__(self, message: str, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after: Optional[float] = None  # seconds the service asked to wait (Retry-After), if any


class Sink(Protocol):
    name: str

    def send(self, envelopes: List[Dict[str, Any]]) -> None:
        """Deliver all of `envelopes`, in order, or raise SinkError. Must be safe to repeat
        (the ids let consumers dedupe)."""

    def close(self) -> None:
        """Flush and release resources."""

    # Optional: `release()`, drop an idle connection (the next send reopens it); see Publisher.
