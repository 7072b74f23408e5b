"""The head row's change log (issue 24): which events each of the last head commits changed.

Every change a decision may read bumps the head row (central.store.fleet_state), so a cache that knows
the head moved from seq a to seq b knew every row as of seq a, and only the events of commits a+1..b can
differ. The head row keeps those events' ids for its last commits (bounded in size: a reader further
behind reads every active row, as before), so catching up costs a read of the changed rows instead of
every active one. Pure: the log is a list of [seq, "id id ..."], oldest first.

A second log (`VMS_COLUMN`) names the VMs that reported the events each commit left open. It is a hint:
a cache that reads another instance's changed events reads the VM rows it has never seen in the same query
(budget counts and the waiting events' groups need them), instead of in a round trip of its own when a
decision asks; a hint that does not reach back costs those later reads, nothing else.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Dict, Iterable, List, Optional, Set

from .int64 import plain
from .tables import get_json, put_json

COLUMN = "Changed"
LOG_CHARS = 12_000  # ~300 event ids: a few batches of every instance; one column (< 32K characters)
VMS_COLUMN = "ChangedVms"
VMS_CHARS = 6_000  # ~150 vmIds: a hint, so a shorter reach than the events' log is enough

Log = List[List[Any]]


class Head:
    """The head row as read (or written) with its ETag: its sequence, and its logs, each parsed once, when
    first asked for (a catch-up asks for both; a cache at the head, for neither)."""

    def __init__(self, entity: Dict[str, Any], etag: Optional[str]) -> None:
        self.entity, self.etag = entity, etag
        self.seq = int(plain(entity.get("Seq"), 0))

    @cached_property
    def log(self) -> Optional[Log]:
        return read(self.entity)

    @cached_property
    def vms(self) -> Optional[Log]:
        return read(self.entity, VMS_COLUMN)


def read(head: Dict[str, Any], column: str = COLUMN) -> Optional[Log]:
    """The log a head entity carries (None: none, e.g. a head written before the log existed)."""
    found = get_json(head, column)
    return found if isinstance(found, list) else None


def appended(log: Optional[Log], seq: int, ids: Iterable[str], chars: int = LOG_CHARS) -> Log:
    """`log` with commit `seq`'s ids added, oldest commits dropped to stay within `chars`."""
    out = [*(log or []), [seq, " ".join(sorted(ids))]]
    size = sum(len(entry[1]) + 16 for entry in out)
    while len(out) > 1 and size > chars:
        size -= len(out[0][1]) + 16
        out.pop(0)
    return out


def write(head: Dict[str, Any], log: Log, column: str = COLUMN) -> None:
    put_json(head, column, log)


def changed_since(log: Optional[Log], have: int, now: int) -> Optional[Set[str]]:
    """The events changed by commits have+1..now, or None when the log does not reach back that far."""
    if now == have:
        return set()
    if log is None or now < have:
        return None
    seqs = [int(entry[0]) for entry in log]
    if not seqs or seqs[-1] != now or seqs[0] > have + 1 or seqs != list(range(seqs[0], now + 1)):
        return None
    out: Set[str] = set()
    for seq, ids in log:
        if int(seq) > have:
            out.update(str(ids).split())
    return out
