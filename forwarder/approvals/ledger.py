"""The local, durable record that keeps approvals at most once across crashes and redelivered messages.

One JSON file in the state dir, replaced atomically (write temp, fsync, rename). It remembers:
- events: EventId -> {state: "pending" (a POST may have gone out) | "approved", messageId, decidedBy, at}
- messages: messageId -> the approval-result data published for it (so a second pass re-reports it)
- fastpath: EventIds the local fast path has handled
Entries older than `keep_seconds` are pruned (events live minutes to days; a week is ample).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from ..outbox import StateError
from . import file_lock

log = logging.getLogger(__name__)


class LedgerError(StateError):
    """The ledger's file or lock cannot be opened or written: check --state-dir (writable by the service
    user, free space). Raised instead of the OSError, so `run`/`approve` end with exit 6 and one line."""

FILE_NAME = "approvals-ledger.json"
# How long a writer waits for the other process (the daemon or `approve`); a ledger access takes
# milliseconds, so a lock held this long means a process hangs holding it.
LOCK_TIMEOUT_SECONDS = 60.0
SECTIONS = ("events", "messages", "fastpath")


class Ledger:
    def __init__(
        self, state_dir: str, keep_seconds: float = 8 * 24 * 3600.0, max_entries: int = 5000
    ) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self.keep_seconds = keep_seconds
        self.max_entries = max_entries
        self._lock = threading.RLock()
        self._lock_path = self.path.with_suffix(".lock")
        self._depth = 0
        self._data: Dict[str, Dict[str, Any]] = {s: {} for s in SECTIONS}
        with self._locked():
            pass

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Thread lock + an advisory file lock, and a fresh read: the daemon and `se-forwarder approve`
        share the file, so every access re-reads it and every change is read-modify-write."""
        with self._lock:
            if self._depth:  # nested in this thread: the file lock is already held
                yield
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                lock_file = open(self._lock_path, "a+")  # closed in the finally below
            except OSError as exc:
                raise LedgerError(f"cannot open the approval ledger lock {self._lock_path}: "
                                  f"{exc.strerror or exc}; check --state-dir (writable by the service "
                                  "user, free space)") from exc
            try:
                file_lock.acquire(lock_file, LOCK_TIMEOUT_SECONDS)
            except OSError as exc:
                lock_file.close()
                raise LedgerError(f"cannot lock the approval ledger {self._lock_path}: {exc}; another "
                                  "se-forwarder process holds it (is one hung?)") from exc
            self._depth += 1
            try:
                self._load()
                yield
            finally:
                self._depth -= 1
                file_lock.release(lock_file)
                lock_file.close()

    def _load(self) -> None:
        self._data = {s: {} for s in SECTIONS}
        if not self.path.exists():
            return
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            # Keep the unreadable file for a person to inspect; start empty rather than refuse to run.
            aside = self.path.with_suffix(f".corrupt-{int(time.time())}")
            log.error("approval ledger %s unreadable (%s); moved to %s", self.path, exc, aside)
            try:
                self.path.replace(aside)
            except OSError:
                pass
            return
        for section in SECTIONS:
            if isinstance(raw.get(section), dict):
                self._data[section] = raw[section]

    def _save(self) -> None:
        self._prune()
        tmp = self.path.with_suffix(".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self._data, fh, separators=(",", ":"), sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            if hasattr(os, "O_DIRECTORY"):
                fd = os.open(str(self.path.parent), os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise LedgerError(f"cannot write the approval ledger {self.path}: {exc.strerror or exc}; "
                              "check --state-dir (writable by the service user, free space)") from exc

    def _prune(self) -> None:
        cutoff = time.time() - self.keep_seconds
        for section in SECTIONS:
            entries = self._data[section]
            old = [k for k, v in entries.items() if float(v.get("t", 0)) < cutoff]
            for k in old:
                del entries[k]
            if len(entries) > self.max_entries:
                for k in sorted(entries, key=lambda k: float(entries[k].get("t", 0)))[
                    : len(entries) - self.max_entries
                ]:
                    del entries[k]

    # ---- events ---------------------------------------------------------------------------------

    def event(self, event_id: str) -> Optional[Dict[str, Any]]:
        with self._locked():
            entry = self._data["events"].get(event_id)
            return dict(entry) if entry else None

    def mark_event(self, event_id: str, state: str, message_id: Optional[str], decided_by: str) -> None:
        """Durably record `state` for an event ("approved" after the POST; "pending" is claim_event's)."""
        with self._locked():
            self._data["events"][event_id] = _entry(state, message_id, decided_by)
            self._save()

    def claim_event(self, event_id: str, message_id: Optional[str],
                    decided_by: str) -> Optional[Dict[str, Any]]:
        """Mark the event "pending" unless the ledger already has it, in ONE locked read-modify-write.
        The daemon and `se-forwarder approve` are separate processes: each checks the ledger and IMDS
        first, and both can find the event free; only the one whose claim lands first may POST.
        Returns None when this caller claimed it, else the entry another decision wrote."""
        with self._locked():
            entry = self._data["events"].get(event_id)
            if entry is not None:
                return dict(entry)
            self._data["events"][event_id] = _entry("pending", message_id, decided_by)
            self._save()
            return None

    def forget_event(self, event_id: str) -> None:
        with self._locked():
            if self._data["events"].pop(event_id, None) is not None:
                self._save()

    # ---- messages -------------------------------------------------------------------------------

    def message(self, message_id: str) -> Optional[Dict[str, Any]]:
        with self._locked():
            entry = self._data["messages"].get(message_id)
            return dict(entry["result"]) if entry else None

    def mark_message(self, message_id: str, result: Dict[str, Any]) -> None:
        """Record the result published for a queue message (after it is durable in the outbox)."""
        with self._locked():
            self._data["messages"][message_id] = {"result": result, "t": time.time()}
            self._save()

    # ---- fast path ------------------------------------------------------------------------------

    def fastpath_seen(self, event_id: str) -> bool:
        with self._locked():
            return event_id in self._data["fastpath"]

    def mark_fastpath(self, event_id: str) -> None:
        with self._locked():
            self._data["fastpath"][event_id] = {"t": time.time()}
            self._save()


def _entry(state: str, message_id: Optional[str], decided_by: str) -> Dict[str, Any]:
    return {"state": state, "messageId": message_id, "decidedBy": decided_by, "t": time.time()}
