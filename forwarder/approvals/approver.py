"""Carry out one approval decision: duplicate check, live IMDS check, optional pre-approval hook, POST.

Shared by the queue reader (central's decisions), `se-forwarder approve` (a person) and the local
fast path. The order keeps approvals at most once across crashes: the ledger marks the event
"pending" (fsynced) BEFORE the POST and "approved" after it; a pass that finds "pending" never POSTs
again, it reports from what IMDS shows (Started or gone: approved; still Scheduled: post-failed).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Dict, Optional

from .. import hooks
from ..imds import ImdsError, ImdsRejected
from . import gate
from .ledger import Ledger
from .message import Rejected
from .result import APPROVED, HOOK_FAILED, POST_FAILED, REJECTED, ApprovalResult

log = logging.getLogger(__name__)

APPROVE = "approve"
HOOK_THEN_APPROVE = "hook-then-approve"
HOOK_ONLY = (
    "hook-only"  # the fast path with --local-approve off: drain, let central (or NotBefore) decide
)


@dataclass
class Approver:
    imds: gate.ImdsLike
    ledger: Ledger
    vm_id: str
    vm_name: str
    hook_settings: hooks.HookSettings = field(default_factory=hooks.HookSettings)
    # hook-then-approve with no pre-approve hook installed: False (default) = approve, and the result's
    # reason says no hook was installed (a fresh install has none); True (setting
    # require_pre_approve_hook) = hook-failed, for fleets where every VM must drain first.
    require_hook: bool = False
    # Observer called right after IMDS accepted a POST, before anything is recorded: the crash tests
    # SIGKILL the process there. Production leaves it None.
    after_post: Optional[Callable[[str], None]] = None
    # One decision per event at a time: the fast path and the queue reader run on different threads.
    _event_locks: Dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _locks_guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def decide(self, event_id: str, action: str, decided_by: str, message_id: Optional[str] = None,
               reason: str = "", require_hook: Optional[bool] = None,
               expires_at: Optional[datetime] = None) -> ApprovalResult:
        """See `_decide`. Serialised per EventId, so a second decision sees the first one's ledger entry."""
        with self._locks_guard:
            lock = self._event_locks.setdefault(event_id, threading.Lock())
            if len(self._event_locks) > 1000:  # bounded: drop idle locks of old events
                for key in [k for k, v in self._event_locks.items() if k != event_id and not v.locked()]:
                    del self._event_locks[key]
        with lock:
            return self._decide(event_id, action, decided_by, message_id, reason, require_hook, expires_at)

    def _decide(
        self,
        event_id: str,
        action: str,
        decided_by: str,
        message_id: Optional[str] = None,
        reason: str = "",
        require_hook: Optional[bool] = None,
        expires_at: Optional[datetime] = None,
    ) -> ApprovalResult:
        """Returns the result to publish. Raises ImdsError only when IMDS could not be read before any
        POST (the caller retries later: nothing was decided). `require_hook`: hook-then-approve with no
        pre-approve hook installed fails (default: the approver's `require_hook`). `expires_at`: the
        message's expiry, checked again just before the POST: a hook may outlast it, and by then central
        has given up on this attempt (it fails over to another VM or to ARM), so a late POST would be a
        second approval."""
        if require_hook is None:
            require_hook = self.require_hook
        base = {"event_id": event_id, "message_id": message_id, "decided_by": decided_by}
        try:
            earlier = self._earlier(event_id, message_id)
            if earlier is not None:
                return ApprovalResult(**base, **earlier)
            event = gate.live_event(self.imds, event_id, self.vm_name)
            hook_summary = None
            note = ""
            if action in (HOOK_THEN_APPROVE, HOOK_ONLY):
                try:
                    env = self._hook_env(event, decided_by, message_id, reason)
                    run = hooks.run_phase(hooks.PRE_APPROVE, env, self.hook_settings)
                except Exception as exc:
                    log.exception("event %s: the pre-approve hooks could not be run", event_id)
                    why = f"pre-approve hooks could not be run: {type(exc).__name__}: {exc}"
                    return ApprovalResult(**base, outcome=HOOK_FAILED, reason=why[:1024])
                hook_summary = run.summary()
                failure = run.failure()
                if not failure and run.ran == 0 and action == HOOK_THEN_APPROVE:
                    if require_hook:
                        failure = (f"no pre-approve hook installed in {run.directory} "
                                   "(require_pre_approve_hook is on)")
                    else:
                        note = (f"; no pre-approve hook installed in {run.directory}: approved without one "
                                "(require_pre_approve_hook refuses instead)")
                if failure:
                    log.warning("event %s: %s; not approved", event_id, failure)
                    return ApprovalResult(**base, outcome=HOOK_FAILED, reason=failure, hook=hook_summary)
                if action == HOOK_ONLY:
                    return ApprovalResult(
                        **base,
                        outcome=REJECTED,
                        hook=hook_summary,
                        reason="hook-only: pre-approve hook succeeded; approval left to central",
                    )
                # The hook may have taken minutes: the event may have started or vanished meanwhile.
                event = gate.live_event(self.imds, event_id, self.vm_name)
            now = datetime.now(timezone.utc)
            if expires_at is not None and now >= expires_at:
                why = (f"stale: the message expired at {expires_at.isoformat()}, before the POST (now "
                       f"{now.isoformat()}); not approved")
                log.warning("event %s (message %s): %s", event_id, message_id, why)
                return ApprovalResult(**base, outcome=REJECTED, reason=why, hook=hook_summary)
            # POSTed as IMDS spells it (central's message may carry the other case: gate.check_event)
            return self._post(event_id, decided_by, message_id, hook_summary, note,
                              imds_id=str(event.get("EventId") or event_id))
        except Rejected as exc:
            log.warning(
                "event %s (message %s, by %s) rejected: %s", event_id, message_id, decided_by, exc.reason
            )
            return ApprovalResult(**base, outcome=REJECTED, reason=exc.reason)

    def _earlier(self, event_id: str, message_id: Optional[str]) -> Optional[Dict[str, str]]:
        """What an earlier decision for this event settles (outcome, reason), or None to go on."""
        entry = self.ledger.event(event_id)
        if entry is None:
            return None
        if entry["state"] == "approved":
            if message_id is not None and entry.get("messageId") == message_id:
                return {"outcome": APPROVED, "reason": "already approved by this message (second pass)"}
            raise Rejected(
                f"duplicate: event {event_id} was already approved by "
                f"{entry.get('decidedBy')} (message {entry.get('messageId')})"
            )
        # "pending": a POST may have reached IMDS before a crash. Never POST again; report what IMDS shows.
        try:
            gate.live_event(self.imds, event_id, self.vm_name)
        except Rejected as exc:
            if exc.reason.startswith(("not-scheduled", "unknown-event")):
                self.ledger.mark_event(
                    event_id, "approved", entry.get("messageId"), entry.get("decidedBy", "")
                )
                return {
                    "outcome": APPROVED,
                    "reason": f"approved by an interrupted earlier attempt (IMDS now: {exc.reason})",
                }
            raise
        return {
            "outcome": POST_FAILED,
            "reason": "an earlier attempt was interrupted during its POST and the event is still Scheduled; "
            "not POSTed again (approvals are at most once); NotBefore will start it",
        }

    def _post(
        self, event_id: str, decided_by: str, message_id: Optional[str], hook_summary: Optional[Dict],
        note: str = "", imds_id: str = "",
    ) -> ApprovalResult:
        base = {
            "event_id": event_id,
            "message_id": message_id,
            "decided_by": decided_by,
            "hook": hook_summary,
        }
        held = self.ledger.claim_event(event_id, message_id, decided_by)  # "pending" BEFORE the POST
        if held is not None:  # another process (daemon or `approve`) claimed it since _earlier
            raise Rejected(f"duplicate: event {event_id} is already being approved by "
                           f"{held.get('decidedBy')} (message {held.get('messageId')})")
        try:
            self.imds.start_events([imds_id or event_id])
        except ImdsError as exc:
            # IMDS refused or stayed unreachable through the retries: nothing started; a new decision
            # may retry.
            self.ledger.forget_event(event_id)
            kind = "refused" if isinstance(exc, ImdsRejected) else "unreachable"
            log.error("event %s: approval POST failed (%s): %s", event_id, kind, exc)
            return ApprovalResult(**base, outcome=POST_FAILED, reason=f"IMDS {kind}: {exc}"[:1024])
        if self.after_post is not None:
            self.after_post(event_id)
        self.ledger.mark_event(event_id, "approved", message_id, decided_by)
        log.info(
            "event %s approved (StartRequests POSTed) by %s, message %s",
            event_id,
            decided_by,
            message_id,
        )
        return ApprovalResult(**base, outcome=APPROVED, reason="StartRequests accepted by IMDS" + note)

    def _hook_env(
        self, event: Dict, decided_by: str, message_id: Optional[str], reason: str
    ) -> Dict[str, str]:
        return hooks.event_environment(
            event,
            self.vm_name,
            self.vm_id,
            extra={
                "SE_DECIDED_BY": decided_by,
                "SE_MESSAGE_ID": message_id or "",
                "SE_DECISION_REASON": reason[:1024],
            },
        )
