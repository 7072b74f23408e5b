"""forwarder.disk_full: which failures are a full disk, and the once-per-episode notice (the fault suite's
tests/fault/test_forwarder_disk_full.py runs the forwarder on a full tmpfs)."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from forwarder.disk_full import Notice, is_disk_full


def test_sqlite_full_and_enospc_are_a_full_disk_even_when_raised_during_another_error() -> None:
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("publisher step failed")  # noqa: B904 - the chain is what is tested
    except RuntimeError as exc:
        assert is_disk_full(exc)
    assert not is_disk_full(sqlite3.OperationalError("database is locked"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(None)


def test_the_notice_says_full_once_and_space_again_once() -> None:
    notice = Notice()
    assert notice.full() and not notice.full() and not notice.full()
    assert notice.cleared() and not notice.cleared()
    assert notice.full(), "a second episode is said again"


def test_a_real_sqlite_full_is_recognised(tmp_path: Path) -> None:
    db = sqlite3.connect(str(tmp_path / "x.sqlite3"))
    db.execute("CREATE TABLE t (v BLOB)")
    db.execute("PRAGMA max_page_count=2")  # a database that cannot grow: SQLite answers SQLITE_FULL
    try:
        db.execute("INSERT INTO t VALUES (?)", (b"\0" * 100_000,))
    except sqlite3.Error as exc:
        assert is_disk_full(exc), repr(exc)
    else:
        raise AssertionError("SQLite accepted a row past max_page_count")
    finally:
        db.close()
