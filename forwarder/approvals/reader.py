"""The approval queue reader: reads this VM's queue while it matters and carries out each message.

An approval only makes sense while IMDS lists a Scheduled event naming this VM, and the poller shows
the reader every document (`observe`). So the queue is read every `fast_interval` seconds while such
an event exists, at once when one appears, and NOT AT ALL otherwise: an idle VM costs no queue
transactions (a message left behind expires by its TTL, which central sets to the decision's expiry).

Per message: poison check (dequeue count) -> decode -> schema -> second pass? -> addressed to this
VM -> not expired -> `Approver.decide` (live IMDS check, hook, POST) -> publish the result (durable in
the outbox) -> remember the message in the ledger -> delete it. A crash anywhere re-reads the message
after its visibility timeout; the ledger makes that pass report again without a second POST.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from .. import logs, validation
from ..backoff import Backoff
from ..clock import iso
from ..imds import ImdsError
from . import message as msgs
from .approver import Approver
from .gate import has_scheduled
from .ledger import Ledger
from .queue import errors as queue_errors
from .result import APPROVED, REJECTED, ApprovalResult
from .settings import ReaderSettings

log = logging.getLogger(__name__)

RAW_KEEP = (
    2048  # characters of a rejected message kept in its result (the rest stays in the poison file)
)


IDLE_WAIT = 3600.0  # no Scheduled event for this VM: wait for `observe` to wake the reader
__all__ = ["IDLE_WAIT", "ApprovalReader", "ReaderSettings"]

Publish = Callable[[ApprovalResult], None]


class ApprovalReader:
    def __init__(
        self,
        queue: Any,
        approver: Approver,
        ledger: Ledger,
        publish: Publish,
        settings: Optional[ReaderSettings] = None,
        poison_queue: Any = None,
        stop: Optional[threading.Event] = None,
    ) -> None:
        self.queue = queue
        self.approver = approver
        self.ledger = ledger
        self.publish = publish
        self.settings = settings or ReaderSettings()
        self.poison_queue = poison_queue
        self.stop = stop or threading.Event()
        self._wake = threading.Event()
        self._scheduled = False
        self.queue_missing = False
        self.stats: Dict[str, int] = {"receives": 0, "messages": 0, "errors": 0, "poison": 0}
        self.last_error: Optional[str] = None
        self._backoff = Backoff(base=1.0, cap=max(1.0, self.settings.slow_interval))

    # ---- adaptive polling -----------------------------------------------------------------------

    def observe(self, document: Dict[str, Any]) -> None:
        """Called with each IMDS document the daemon reads: read while this VM has a Scheduled event."""
        scheduled = has_scheduled(document, self.approver.vm_name)
        was, self._scheduled = self._scheduled, scheduled
        if scheduled and not was:
            self._wake.set()  # an approval may already be waiting: read now

    @property
    def scheduled(self) -> bool:
        return self._scheduled

    def interval(self) -> float:
        # Fast while Scheduled even if the queue is missing: central creates it with its first
        # approval, which is exactly what a new Scheduled event is about to bring. Otherwise: no reads.
        return self.settings.fast_interval if self._scheduled else IDLE_WAIT

    def run(self, max_seconds: Optional[float] = None) -> None:
        """Poll until `stop` (or `max_seconds`). Queue errors back off (jittered, capped), never end it."""
        end = None if max_seconds is None else time.monotonic() + max_seconds
        while not self.stop.is_set() and (end is None or time.monotonic() < end):
            self.step(None if end is None else max(0.0, end - time.monotonic()))

    def step(self, max_wait: Optional[float] = None) -> None:
        """One receive and its messages, then the adaptive wait (the daemon's worker step). Without a
        Scheduled event for this VM: no receive, only the wait (until `observe` wakes it)."""
        if not self._scheduled:
            self._sleep(IDLE_WAIT if max_wait is None else min(IDLE_WAIT, max_wait))
            return
        unavailable, _missing = queue_errors()
        try:
            more = self.poll_once()
            self._backoff.reset()
            wait = 0.0 if more else self.interval()
        except unavailable as exc:
            self.stats["errors"] += 1
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            self.last_error = f"{type(exc).__name__}: {first}"
            # throttled (429/503): never sooner than the service asks, believed up to the slow interval
            wait = max(0.5, self._backoff.delay_after(getattr(exc, "retry_after", None),
                                                      max(1.0, self.settings.slow_interval)))
            log.warning("approval queue unavailable (%s); retrying in %.1fs", self.last_error, wait)
        if max_wait is not None:
            wait = min(wait, max_wait)
        self._sleep(wait)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._wake.wait(min(left, 1.0)):  # 1 s slices so `stop` is seen promptly
                self._wake.clear()
                return

    # ---- one poll -------------------------------------------------------------------------------

    def poll_once(self) -> bool:
        """One receive (one queue transaction) and every message in it. True if the batch was full."""
        _unavailable, missing = queue_errors()
        self.stats["receives"] += 1
        try:
            received = list(
                self.queue.receive_messages(
                    messages_per_page=self.settings.batch,
                    max_messages=self.settings.batch,
                    visibility_timeout=self.settings.visibility_timeout,
                )
            )
        except missing:
            if not self.queue_missing:
                log.info(
                    "approval queue %s does not exist (yet): no approvals; polling slowly",
                    getattr(self.queue, "queue_name", "?"),
                )
            self.queue_missing = True
            return False
        self.queue_missing = False
        for item in received:
            if self.stop.is_set():
                break
            self.stats["messages"] += 1
            self.handle(item)
        return len(received) >= self.settings.batch

    def handle(self, item: Any) -> None:
        """One queue message, end to end. Leaves it in the queue when the outcome is not yet durable."""
        try:
            result = self._decide(item)
        except ImdsError as exc:
            log.warning(
                "message %s left for later: IMDS unreadable before any decision (%s)", item.id, exc
            )
            return
        except validation.ValidationUnavailable as exc:
            log.warning("message %s left for later: %s", item.id, exc)
            return
        if result is None:
            return
        # One structured line per message: the outcome and its reason, for operators and log queries.
        log.log(logging.INFO if result.outcome == APPROVED else logging.WARNING,
                "approval message %s: %s (%s)", item.id, result.outcome, result.reason,
                extra=logs.fields(outcome=result.outcome, reason=result.reason, eventId=result.event_id,
                                  messageId=result.message_id, queueMessageId=item.id,
                                  dequeueCount=getattr(item, "dequeue_count", None),
                                  decidedBy=result.decided_by))
        try:
            self.publish(result)  # durable in the outbox when it returns
        except Exception as exc:  # noqa: BLE001 - any outbox failure: keep the message, retry later
            log.error(
                "message %s: result %s not durable (%s); message kept for a second pass",
                item.id,
                result.outcome,
                exc,
            )
            return
        key = result.message_id or f"queue:{item.id}"
        self.ledger.mark_message(key, result.as_record())
        self._delete(item)

    def _decide(self, item: Any) -> Optional[ApprovalResult]:
        if int(getattr(item, "dequeue_count", 0) or 0) > self.settings.max_dequeue:
            return self._poison(item)
        try:
            approval = msgs.validate(msgs.decode(item.content))
        except msgs.Rejected as exc:  # logged once, with the result, in handle()
            self._keep_copy(item, exc.reason)
            return self._rejected(item, exc.reason)
        earlier = self.ledger.message(approval.message_id)
        if earlier is not None:
            log.info(
                "message %s (%s) handled before: re-reporting %s, no action",
                approval.message_id,
                item.id,
                earlier["outcome"],
            )
            return ApprovalResult.from_record(earlier)
        entry = self.ledger.event(approval.event_id)
        resuming = entry is not None and entry.get("messageId") == approval.message_id
        # A pass interrupted after these checks passed skips them (the message may be expired now).
        if not resuming:
            try:
                msgs.check_addressed(approval, self.approver.vm_id, self.approver.vm_name)
                msgs.check_fresh(approval, datetime.now(timezone.utc), self.settings.max_clock_skew)
            except msgs.Rejected as exc:
                return ApprovalResult(
                    event_id=approval.event_id,
                    outcome=REJECTED,
                    reason=exc.reason,
                    message_id=approval.message_id,
                    decided_by=approval.decided_by,
                )
        return self.approver.decide(
            approval.event_id,
            approval.action,
            approval.decided_by,
            message_id=approval.message_id,
            reason=approval.reason,
            expires_at=approval.expires_at,
        )

    def _rejected(self, item: Any, reason: str) -> ApprovalResult:
        content = item.content if isinstance(item.content, str) else repr(item.content)
        return ApprovalResult(
            event_id="",
            outcome=REJECTED,
            reason=reason,
            message_id=None,
            decided_by=None,
            extra={
                "queueMessageId": item.id,
                "raw": content[:RAW_KEEP],
                "rawTruncated": len(content) > RAW_KEEP,
            },
        )

    def _poison(self, item: Any) -> ApprovalResult:
        self.stats["poison"] += 1
        reason = f"poison: dequeued {item.dequeue_count} times (limit {self.settings.max_dequeue})"
        where = self._set_aside(item, reason)
        log.error("approval message %s set aside: %s; %s", item.id, reason, where)
        event_id = ""
        try:
            event_id = str(msgs.decode(item.content).get("eventId", ""))[:128]
        except msgs.Rejected:
            pass
        result = self._rejected(item, f"{reason}; {where}")
        result.event_id = event_id
        return result

    def _set_aside(self, item: Any, reason: str) -> str:
        unavailable, _missing = queue_errors()
        if self.poison_queue is not None:
            try:
                self.poison_queue.send_message(item.content)
                return f"moved to queue {self.poison_queue.queue_name}"
            except unavailable as exc:
                log.warning(
                    "cannot move poison message to %s (%s); deleting it after reporting",
                    getattr(self.poison_queue, "queue_name", "?"),
                    str(exc).splitlines()[0][:120],
                )
        path = self._keep_copy(item, reason)
        return f"deleted after reporting (copy: {path})" if path else "deleted after reporting"

    def _keep_copy(self, item: Any, reason: str) -> Optional[str]:
        """A local copy of a message we will delete without acting on it (bounded: last 200 kept)."""
        if not self.settings.poison_dir:
            return None
        directory = Path(self.settings.poison_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"{int(time.time() * 1000)}-{item.id}.json"
            content = item.content if isinstance(item.content, str) else repr(item.content)
            path.write_text(
                json.dumps(
                    {
                        "queueMessageId": item.id,
                        "dequeueCount": item.dequeue_count,
                        "reason": reason,
                        "at": iso(),
                        "content": content[:70000],
                    }
                ),
                encoding="utf-8",
            )
            for old in sorted(directory.glob("*.json"))[:-200]:
                old.unlink()
            return str(path)
        except OSError as exc:
            log.warning("cannot keep a copy of message %s: %s", item.id, exc)
            return None

    def _delete(self, item: Any) -> None:
        unavailable, missing = queue_errors()
        try:
            self.queue.delete_message(item.id, item.pop_receipt)
        except missing:
            pass  # already gone (visibility expired and another pass deleted it)
        except unavailable as exc:
            # The outcome is durable and in the ledger: the next pass re-reports it and deletes.
            log.warning(
                "message %s handled but not deleted (%s); a later pass will",
                item.id,
                str(exc).splitlines()[0][:160],
            )
