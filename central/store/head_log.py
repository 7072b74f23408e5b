"""The head row's change log (issue 24): which events each of the last head commits changed.

Every change a decision may read bumps the head row (central.store.fleet_state), so a cache that knows
the head moved from seq a to seq b knew every row as of seq a, and only the events of commits a+1..b can
differ. The head row keeps those events' ids for its last commits (bounded in size: a reader further
behind reads every active row, as before), so catching up costs a read of the changed rows instead of
every active one. An event that ended is marked: gone (`-`, its active row deleted) or ended with alerts
still owed (`~`, its active row kept until they are delivered). A catch-up drops either without a read: a
decision about another event reads nothing of an ended one (central.policy.fleet_view.seen_by_others),
and most of a wave's catch-up keys were such events. The owed ones are read when something needs their
rows: the timer's and the views' refresh (which deliver and show owed alerts), a report of the event.

Pure. The log is text, one line per commit, oldest first: the sequence, then a tab before each id, the id
marked `+` (changed: read it), `-` (gone) or `~` (ended, alerts owed). Ids never hold a tab or a newline
(they are Table keys, which refuse control characters); an id that did would be written as `*` (read
every active row), so no id can be taken for another. A reader parses only the lines after the commit it
holds (a few, at the end), not the whole log: parsing every log on every catch-up was a measurable share
of a wave's CPU.

A second log (`VMS_COLUMN`, the same format, ids all `+`) names the VMs that reported the events each
commit left open. It is a hint: a cache that reads another instance's changed events reads the VM rows it
has never seen in the same query (budget counts and the waiting events' groups need them), instead of in a
round trip of its own when a decision asks; a hint that does not reach back costs those later reads,
nothing else.

The columns replaced `Changed` and `ChangedVms` (JSON, ids joined by spaces, read whole). A head written
by one version carries none of the other's columns (a commit replaces the whole row), so either version
reading the other's head finds no log and reads every active row, as on a head that predates the logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set

from .int64 import plain

COLUMN = "ChangeLog"
LOG_CHARS = 12_000  # ~300 event ids: a few batches of every instance; one column (< 32K characters)
VMS_COLUMN = "ChangeLogVms"
VMS_CHARS = 6_000  # ~150 vmIds: a hint, so a shorter reach than the events' log is enough
CHANGED, GONE, OWED, UNREADABLE = "+", "-", "~", "*"

Log = str


@dataclass
class Since:
    """What the commits after a held head did: the events to read again, those gone, and those ended whose
    active rows stay while alerts are owed."""

    changed: Set[str] = field(default_factory=set)
    gone: Set[str] = field(default_factory=set)
    owed: Set[str] = field(default_factory=set)

    def every(self) -> Set[str]:
        return self.changed | self.gone | self.owed


class Head:
    """The head row as read (or written) with its ETag: its sequence and its logs."""

    def __init__(self, entity: Dict[str, Any], etag: Optional[str]) -> None:
        self.etag = etag
        self.seq = int(plain(entity.get("Seq"), 0))
        self.log = read(entity)
        self.vms = read(entity, VMS_COLUMN)


def read(head: Dict[str, Any], column: str = COLUMN) -> Optional[Log]:
    """The log a head entity carries (None: none, e.g. a head written by another version)."""
    found = head.get(column)
    return found if isinstance(found, str) else None


def entry(seq: int, changed: Iterable[str], gone: Iterable[str] = (), owed: Iterable[str] = ()) -> str:
    """Commit `seq`'s line."""
    marked = ([CHANGED + i for i in sorted(changed)] + [GONE + i for i in sorted(gone)]
              + [OWED + i for i in sorted(owed)])
    if any(("\t" in m or "\n" in m or len(m) == 1) for m in marked):
        marked = [UNREADABLE]
    return "\t".join([str(seq), *marked])


def appended(log: Optional[Log], seq: int, changed: Iterable[str], chars: int = LOG_CHARS,
             gone: Iterable[str] = (), owed: Iterable[str] = ()) -> Log:
    """`log` with commit `seq`'s ids added, oldest commits dropped to stay within `chars`; a commit that
    alone names more than `chars` holds is written unreadable (a reader then reads every active row; the
    VMs' hint is lost for it)."""
    line = entry(seq, changed, gone, owed)
    if len(line) > chars:  # one commit naming more than the log holds (a property holds 32K characters)
        line = f"{seq}\t{UNREADABLE}"
    out = f"{log}\n{line}" if log else line
    if len(out) > chars:
        cut = out.find("\n", len(out) - chars - 1)
        out = out[cut + 1:] if cut != -1 else line
    return out


def write(head: Dict[str, Any], log: Log, column: str = COLUMN) -> None:
    head[column] = log


def changed_since(log: Optional[Log], have: int, now: int) -> Optional[Since]:
    """What commits have+1..now changed, or None when the log does not reach back that far (or a line
    cannot be read). Reads the log's lines from its end back to commit have+1 only."""
    if now == have:
        return Since()
    if log is None or now < have:
        return None
    lines: List[List[str]] = []
    end = len(log)
    expect = now
    while expect > have:
        start = log.rfind("\n", 0, end) + 1
        fields = log[start:end].split("\t")
        if fields[0] != str(expect):
            return None  # not the commit expected: the log does not reach back (or is not this head's)
        lines.append(fields[1:])
        if start == 0 and expect > have + 1:
            return None  # the oldest line kept is newer than have+1
        end, expect = start - 1, expect - 1
    out = Since()
    sets = {CHANGED: out.changed, GONE: out.gone, OWED: out.owed}
    for marked in reversed(lines):  # oldest first: the newest mark of an id wins
        for m in marked:
            mark, event_id = m[:1], m[1:]
            if mark not in sets:
                return None
            for found in sets.values():
                found.discard(event_id)
            sets[mark].add(event_id)
    return out


def ids_since(log: Optional[Log], have: int, now: int) -> Optional[Set[str]]:
    """Every id commits have+1..now name, however marked (the VMs' hint), or None as changed_since."""
    found = changed_since(log, have, now)
    return None if found is None else found.every()
