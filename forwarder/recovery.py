"""Recovery: when an event this VM was in disappears from the document (done or cancelled), run the
post-event hooks and report (approval-result envelope, outcome `completed` or `post-hook-failed`).

The events being watched are kept in the state dir, so an event that ends while the forwarder is
down is still noticed on the first document after it starts again. An event that has gone stays in the
file, marked as ending, until its result is in the outbox: post-event hooks run at least once, and a crash
or restart between the hook and the report runs them again on the first document after it (keep them
idempotent).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Set

from . import hooks
from .approvals.gate import events_of, involves
from .approvals.result import COMPLETED, POST_HOOK_FAILED, ApprovalResult

log = logging.getLogger(__name__)

FILE_NAME = "recovery-watched.json"
DECIDED_BY = "local:recovery"
ENDING = "seForwarderEnding"  # set on a saved event that has gone and whose result is not yet published


@dataclass
class Recovery:
    state_dir: str
    vm_id: str
    vm_name: str
    publish: Callable[[ApprovalResult], None]
    hook_settings: hooks.HookSettings = field(default_factory=hooks.HookSettings)
    _watched: Dict[str, Dict[str, Any]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _threads: List[threading.Thread] = field(default_factory=list, repr=False)
    _running: Set[str] = field(default_factory=set, repr=False)  # events whose hooks and report are under way

    def __post_init__(self) -> None:
        self.path = Path(self.state_dir) / FILE_NAME
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                self._watched = {str(k): v for k, v in data.items() if isinstance(v, dict)}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.error(
                "recovery state %s unreadable (%s); starting with no watched events", self.path, exc
            )

    def observe(self, document: Dict[str, Any]) -> None:
        """Called with each valid IMDS document (never on a failed read: an error is not a disappearance)."""
        current = {
            str(e.get("EventId")): e
            for e in events_of(document)
            if e.get("EventId") and involves(e, self.vm_name)
        }
        listed = {str(e.get("EventId")) for e in events_of(document)}
        with self._lock:
            gone = [eid for eid, ev in self._watched.items() if eid not in listed and not ev.get(ENDING)]
            changed = bool(gone) or any(self._watched.get(eid) != ev for eid, ev in current.items())
            for eid in gone:  # kept, marked, until the result is published (_finish)
                self._watched[eid] = {**self._watched[eid], ENDING: True}
            self._watched.update(current)
            if changed:
                self._save()
            # the gone ones, and any a crash or restart left ending (their hooks run again)
            due = [(eid, {k: v for k, v in ev.items() if k != ENDING}) for eid, ev in self._watched.items()
                   if ev.get(ENDING) and eid not in self._running]
            self._running.update(eid for eid, _ in due)
        for event_id, event in due:
            thread = threading.Thread(
                target=self._finish, args=(event_id, event), daemon=True, name=f"recovery-{event_id[:8]}"
            )
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def watched(self) -> List[str]:
        """The events being watched (not those gone whose report is still due)."""
        with self._lock:
            return sorted(eid for eid, ev in self._watched.items() if not ev.get(ENDING))

    def _finish(self, event_id: str, event: Dict[str, Any]) -> None:
        # The last status seen tells done from cancelled (an event that started and ended between two
        # polls is reported as cancelled: IMDS gives no more).
        ending = "completed" if event.get("EventStatus") == "Started" else "cancelled"
        env = hooks.event_environment(event, self.vm_name, self.vm_id, extra={"SE_EVENT_END": ending})
        try:
            run = hooks.run_phase(hooks.POST_EVENT, env, self.hook_settings)
        except Exception as exc:
            log.exception("post-event hooks for event %s could not be run", event_id)
            failed = hooks.HookResult(name="post-event.d", refused=f"{type(exc).__name__}: {exc}")
            run = hooks.HookRun(hooks.POST_EVENT, str(self.hook_settings.hook_dir), [failed])
        failure = run.failure()
        result = ApprovalResult(
            event_id=event_id,
            outcome=POST_HOOK_FAILED if failure else COMPLETED,
            decided_by=DECIDED_BY,
            reason=failure or f"event gone from IMDS ({ending}); {run.ran} post-event hook(s) ran",
            hook=run.summary(),
            extra={"ending": ending, "lastSeen": event},
        )
        log.info("event %s gone (%s): %s", event_id, ending, result.reason)
        try:
            self.publish(result)
        except Exception as exc:  # noqa: BLE001 - keep the worker alive; the hook already ran
            # kept ending in the file and left running: the next start runs the hooks and reports again
            log.error("recovery: result for event %s not published (reported after a restart): %s",
                      event_id, exc)
            return
        with self._lock:
            if self._watched.get(event_id, {}).get(ENDING):  # (not listed again meanwhile)
                del self._watched[event_id]
                self._save()
            self._running.discard(event_id)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self._watched, fh, separators=(",", ":"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def join(self, timeout: float = 10.0) -> None:
        for thread in list(self._threads):
            thread.join(timeout)
