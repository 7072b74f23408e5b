"""The durable outbox: SQLite in the state directory (WAL, synchronous=FULL).

`put()` writes the envelope AND the forwarder's state (last incarnation, last document, ...) in ONE
transaction, so a crash at any instant leaves either both or neither: a restart neither skips an
incarnation (the state was not advanced) nor publishes it twice (the row and the state went
together). A sink drains with `peek()` then `ack()` only after the send succeeded; an acknowledged
row is deleted in its own committed transaction, so it is never sent again.

Broken state heals: a database SQLite finds corrupt at start ("file is not a database", a failed
quick_check) is set aside (renamed `outbox.sqlite3.corrupt-<UTC time>`, with its -wal/-shm, kept for
inspection) and a fresh one is started; the fresh one remembers what was set aside (`setAside` in
every heartbeat's outbox object, and `se-forwarder check` lists the files). A state directory that is
not writable is an OutboxError (exit 6), never a half-working daemon.

Bounded: at most `max_rows` pending rows. When full, a put never fails and nothing goes silently:
the oldest heartbeats are dropped first (a newer heartbeat says the same thing; a new heartbeat
into an outbox full of incarnations is itself the one dropped), then the oldest
other envelopes (incarnations, quarantined documents, approval results; the newest are kept, since
each incarnation carries the whole document); every drop is counted in `dropped()`, persistently,
and reported in heartbeats.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import disk_full
from .clock import iso

DB_NAME = "outbox.sqlite3"
SET_ASIDE_GLOB = DB_NAME + ".corrupt-*"
log = logging.getLogger(__name__)
DEFAULT_MAX_ROWS = 10000
HEARTBEAT_TYPE = "scheduledevents.heartbeat.v1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    type TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_type ON outbox(type, seq);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StateError(Exception):
    """The state directory cannot be used (the outbox or the approval ledger): `run` exits 6."""


class OutboxError(StateError):
    """The outbox database cannot be opened or written: check --state-dir (exists, writable, disk space)."""


class _Corrupt(Exception):
    """SQLite says the database file is damaged (not an access problem)."""


def _is_corrupt(exc: sqlite3.Error) -> bool:
    # OperationalError is about access (permissions, locks, I/O); a plain DatabaseError is the file.
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)


@dataclass
class Item:
    seq: int
    id: str
    type: str
    envelope: Dict[str, Any]
    created_at: float


class Outbox:
    def __init__(self, state_dir: Path, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        if max_rows < 1:
            raise ValueError("outbox max_rows must be >= 1")
        self.max_rows = max_rows
        self.path = Path(state_dir) / DB_NAME
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not os.access(self.path.parent, os.W_OK):
                raise OSError(f"the directory is not writable by this user (uid {_uid()})")
            try:
                self._db = self._connect()
            except _Corrupt as exc:
                self._db = self._start_fresh(str(exc))
        except (OSError, sqlite3.Error) as exc:
            raise OutboxError(f"cannot open the outbox at {self.path}: {exc}; check --state-dir "
                              "(it must exist or be creatable, be writable by the service user, and have "
                              "free space)") from exc

    def _connect(self) -> sqlite3.Connection:
        """Open, check and prepare the database; _Corrupt if SQLite finds the file damaged."""
        db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=30000")
            (verdict,) = db.execute("PRAGMA quick_check").fetchone()
            if verdict != "ok":
                raise _Corrupt(f"quick_check: {verdict}"[:300])
            db.executescript(_SCHEMA)
            db.execute("BEGIN IMMEDIATE")  # a write lock now, not at the first put: read-only shows here
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            db.close()
            if _is_corrupt(exc):
                raise _Corrupt(str(exc)) from exc
            raise
        except _Corrupt:
            db.close()
            raise
        return db

    def _start_fresh(self, why: str) -> sqlite3.Connection:
        """Set the damaged database aside (kept for inspection) and open a new one that says so."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{DB_NAME}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(self.path) + suffix)
            if source.exists():
                os.replace(source, Path(str(aside) + suffix))
        log.error("outbox %s is corrupt (%s): set aside as %s; starting a fresh outbox (what was pending "
                  "in it is not sent)", self.path, why, aside)
        db = self._connect()
        record = {"path": str(aside), "at": iso(), "error": why[:300]}
        db.execute("INSERT INTO state(key, value) VALUES ('set_aside', ?)", (json.dumps(record),))
        return db

    # ---- state --------------------------------------------------------------------------------

    def _get(self, key: str, default: Any = None) -> Any:
        row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def _set(self, key: str, value: Any) -> None:
        self._db.execute("INSERT INTO state(key, value) VALUES (?, ?) "
                         "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, json.dumps(value)))

    def get_state(self, key: str, default: Any = None) -> Any:
        with self._lock:
            return self._get(key, default)

    def set_state(self, values: Dict[str, Any]) -> None:
        with self._lock, self._tx():
            for key, value in values.items():
                self._set(key, value)

    # ---- writing ------------------------------------------------------------------------------

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    def put(self, envelope: Dict[str, Any], state: Optional[Dict[str, Any]] = None) -> int:
        """Append `envelope` and apply `state` atomically. Returns the row's sequence number."""
        body = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)
        with self._lock, self._tx():
            cur = self._db.execute("INSERT INTO outbox(id, type, body, created_at) VALUES (?, ?, ?, ?)",
                                   (envelope["id"], envelope["type"], body, time.time()))
            seq = int(cur.lastrowid or 0)
            for key, value in (state or {}).items():
                self._set(key, value)
            self._enforce_bound(keep=seq)
        if disk_full.NOTICE.cleared():
            log.warning("the state directory has space again: accepting new envelopes (%s)", self.path)
        return seq

    def _enforce_bound(self, keep: int) -> None:
        (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        excess = count - self.max_rows
        if excess <= 0:
            return
        dropped = 0
        # Oldest heartbeats first (the new row too, if it is a heartbeat: a heartbeat never displaces
        # an incarnation), then the oldest of everything else, never the row just written.
        passes = (("SELECT seq FROM outbox WHERE type = ? ORDER BY seq LIMIT ?", (HEARTBEAT_TYPE,)),
                  ("SELECT seq FROM outbox WHERE type != ? AND seq != ? ORDER BY seq LIMIT ?",
                   (HEARTBEAT_TYPE, keep)))
        for query, params in passes:
            if excess <= 0:
                break
            rows = self._db.execute(query, (*params, excess)).fetchall()
            if rows:
                self._db.executemany("DELETE FROM outbox WHERE seq = ?", rows)
                dropped += len(rows)
                excess -= len(rows)
        self._set("dropped", int(self._get("dropped", 0)) + dropped)

    # ---- draining -----------------------------------------------------------------------------

    def peek(self, limit: int = 100) -> List[Item]:
        """The oldest `limit` pending envelopes, in order (nothing is removed)."""
        with self._lock:
            rows = self._db.execute("SELECT seq, id, type, body, created_at FROM outbox ORDER BY seq LIMIT ?",
                                    (limit,)).fetchall()
        return [Item(seq=r[0], id=r[1], type=r[2], envelope=json.loads(r[3]), created_at=r[4]) for r in rows]

    def ack(self, seqs: Sequence[int]) -> None:
        """The sink has these: delete them and record the send time (one transaction)."""
        if not seqs:
            return
        with self._lock, self._tx():
            self._db.executemany("DELETE FROM outbox WHERE seq = ?", [(s,) for s in seqs])
            self._set("last_send_at", time.time())
            self._set("last_error", None)

    def record_error(self, message: str) -> None:
        with self._lock, self._tx():
            self._set("last_error", message[:500])
            self._set("last_error_at", time.time())

    # ---- reporting ----------------------------------------------------------------------------

    def backlog(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def dropped(self) -> int:
        return int(self.get_state("dropped", 0))

    @property
    def last_send_at(self) -> Optional[float]:
        return self.get_state("last_send_at")

    @property
    def last_error(self) -> Optional[str]:
        return self.get_state("last_error")

    def stats(self) -> Dict[str, Any]:
        """The heartbeat's `outbox` object (`setAside`: a corrupt outbox this one replaced, if any)."""
        last = self.last_send_at
        stats = {"backlog": self.backlog(), "dropped": self.dropped(),
                 "lastSendAt": iso(last) if last else None, "lastError": self.last_error}
        set_aside = self.get_state("set_aside")
        if set_aside:
            stats["setAside"] = set_aside
        return stats

    def close(self) -> None:
        with self._lock:
            try:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass  # another process holds a reader; the WAL is replayed on next open
            self._db.close()


def _uid() -> str:
    return str(os.geteuid()) if hasattr(os, "geteuid") else "?"


def set_aside_files(state_dir: Path) -> List[Path]:
    """Corrupt outboxes set aside in `state_dir` (oldest first), for `se-forwarder check`."""
    return sorted(p for p in Path(state_dir).glob(SET_ASIDE_GLOB) if not p.name.endswith(("-wal", "-shm")))


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")
