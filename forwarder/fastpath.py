"""The local fast path: short-notice events (Preempt, Terminate by default) are handled on the VM at once.

A Preempt gives 30 s of notice: no round trip through Event Hubs, Functions and the queue fits.
When such an event first appears Scheduled for this VM, the pre-approve hooks run immediately and,
with `--local-approve`, the event is approved without waiting for central. Each event is handled once
(the ledger remembers it across restarts); the result is published with decidedBy `local:fastpath`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence

from .approvals.approver import HOOK_ONLY, HOOK_THEN_APPROVE, Approver
from .approvals.gate import events_of, involves
from .approvals.result import ApprovalResult
from .imds import ImdsError

log = logging.getLogger(__name__)

DECIDED_BY = "local:fastpath"
DEFAULT_EVENT_TYPES = ("Preempt", "Terminate")


@dataclass
class FastPath:
    approver: Approver
    publish: Callable[[ApprovalResult], None]
    event_types: Sequence[str] = DEFAULT_EVENT_TYPES
    local_approve: bool = False
    _threads: List[threading.Thread] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, document: Dict[str, Any]) -> None:
        """Called with each IMDS document: start handling every new short-notice event for this VM.

        Each event is handled on its own thread so a slow hook never delays the IMDS poll loop."""
        if not self.event_types:
            return
        for event in events_of(document):
            event_id = str(event.get("EventId", ""))
            if (
                not event_id
                or event.get("EventType") not in self.event_types
                or event.get("EventStatus") != "Scheduled"
                or not involves(event, self.approver.vm_name)
            ):
                continue
            with self._lock:
                if self.approver.ledger.fastpath_seen(event_id):
                    continue
                self.approver.ledger.mark_fastpath(
                    event_id
                )  # before the hook: at most one run per event
                thread = threading.Thread(
                    target=self._handle, args=(event_id,), daemon=True, name=f"fastpath-{event_id[:8]}"
                )
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            log.info(
                "fast path: %s event %s for this VM; running the pre-approve hook%s",
                event.get("EventType"),
                event_id,
                " and approving locally" if self.local_approve else "",
            )
            thread.start()

    def _handle(self, event_id: str) -> None:
        action = HOOK_THEN_APPROVE if self.local_approve else HOOK_ONLY
        try:
            # No hook installed is fine here: the fast path approves on the operator's standing rule.
            result = self.approver.decide(
                event_id,
                action,
                DECIDED_BY,
                require_hook=False,
                reason="short-notice event handled on the VM",
            )
        except ImdsError as exc:
            log.error("fast path: event %s not handled: IMDS unreadable (%s)", event_id, exc)
            return
        if action == HOOK_ONLY and result.reason.startswith("hook-only"):
            log.info(
                "fast path: event %s drained by the hook; approval left to central or NotBefore",
                event_id,
            )
            return
        try:
            self.publish(result)
        except Exception as exc:  # noqa: BLE001 - a lost report must not kill the worker thread
            log.error("fast path: result for event %s not published: %s", event_id, exc)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for running hooks (shutdown and tests)."""
        for thread in list(self._threads):
            thread.join(timeout)
