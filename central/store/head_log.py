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

Budget-group tags (central.policy.group_tags): a changed id may carry its groups' tags after `#` (`+id#t1#t2`;
`+id#`: in no group; `+id`: not known, read by everyone), and a line carries its writer's budgets'
fingerprint as its first field (`@fp`). A reader under other budgets takes the line's ids as untagged. Ids
are Table keys, which refuse `#`; an id holding one would be written as `*`.

The columns replaced `ChangeLog` and `ChangeLogVms` (no tags), which replaced `Changed` and `ChangedVms`
(JSON). A head written by one version carries none of the other's columns (a commit replaces the whole
row), so either version reading the other's head finds no log and reads every active row, as on a head that
predates the logs: an older reader never takes `id#tag` for an id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Protocol, Set, Union

from central.model.vms import VmState

from .int64 import plain

COLUMN = "ChangeLogTagged"
LOG_CHARS = 16_000  # ~300 tagged event ids: a few batches of every instance; one column (< 32K characters)
VMS_COLUMN = "ChangeLogVmsTagged"
VMS_CHARS = 8_000  # ~150 tagged vmIds: a hint, so a shorter reach than the events' log is enough
CHANGED, GONE, OWED, UNREADABLE = "+", "-", "~", "*"
TAGGED, FINGERPRINT = "#", "@"

Log = str
Tags = Optional[FrozenSet[str]]  # a changed id's group tags (None: not known, read by every reader)
Changed = Union[Iterable[str], Mapping[str, Tags]]  # ids, or ids with their tags


class Tagger(Protocol):
    """What tags a log's ids: the budgets' groupings (central.policy.group_tags.Grouping: the service's)."""

    @property
    def fingerprint(self) -> str: ...

    def tags_of(self, vms: Iterable[Optional[VmState]]) -> Tags: ...


@dataclass
class Since:
    """What the commits after a held head did: the events to read again, those gone, and those ended whose
    active rows stay while alerts are owed."""

    changed: Set[str] = field(default_factory=set)
    gone: Set[str] = field(default_factory=set)
    owed: Set[str] = field(default_factory=set)
    tags: Dict[str, FrozenSet[str]] = field(default_factory=dict)  # ids tagged on every line naming them

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


def _tagged(event_id: str, tags: Tags) -> str:
    return event_id if tags is None else TAGGED.join([event_id, *sorted(tags)]) + ("" if tags else TAGGED)


def entry(seq: int, changed: Changed, gone: Iterable[str] = (), owed: Iterable[str] = (),
          fingerprint: str = "") -> str:
    """Commit `seq`'s line (`changed` with tags only under a `fingerprint`)."""
    tagged: Mapping[str, Tags] = (changed if isinstance(changed, Mapping) and fingerprint
                                  else dict.fromkeys(changed))
    ids = [*tagged, *gone, *owed]
    if any(("\t" in i or "\n" in i or TAGGED in i or not i) for i in ids) or TAGGED in fingerprint:
        return f"{seq}\t{UNREADABLE}"
    marked = ([CHANGED + _tagged(i, tagged[i]) for i in sorted(tagged)] + [GONE + i for i in sorted(gone)]
              + [OWED + i for i in sorted(owed)])
    return "\t".join([str(seq), *([FINGERPRINT + fingerprint] if fingerprint else []), *marked])


def appended(log: Optional[Log], seq: int, changed: Changed, chars: int = LOG_CHARS,
             gone: Iterable[str] = (), owed: Iterable[str] = (), fingerprint: str = "") -> Log:
    """`log` with commit `seq`'s ids added, oldest commits dropped to stay within `chars`; a commit that
    alone names more than `chars` holds is written unreadable (a reader then reads every active row; the
    VMs' hint is lost for it)."""
    line = entry(seq, changed, gone, owed, fingerprint)
    if len(line) > chars:  # one commit naming more than the log holds (a property holds 32K characters)
        line = f"{seq}\t{UNREADABLE}"
    out = f"{log}\n{line}" if log else line
    if len(out) > chars:
        cut = out.find("\n", len(out) - chars - 1)
        out = out[cut + 1:] if cut != -1 else line
    return out


def write(head: Dict[str, Any], log: Log, column: str = COLUMN) -> None:
    head[column] = log


def changed_since(log: Optional[Log], have: int, now: int, fingerprint: str = "") -> Optional[Since]:
    """What commits have+1..now changed, or None when the log does not reach back that far (or a line
    cannot be read). Reads the log's lines from its end back to commit have+1 only. Tags are kept for the
    ids tagged under `fingerprint` on every line that names them changed."""
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
    untagged: Set[str] = set()
    for marked in reversed(lines):  # oldest first: the newest mark of an id wins
        ours = bool(marked) and marked[0] == FINGERPRINT + fingerprint and bool(fingerprint)
        if marked and marked[0][:1] == FINGERPRINT:
            marked = marked[1:]
        for m in marked:
            mark, event_id = m[:1], m[1:]
            if mark not in sets:
                return None
            tags: Tags = None
            if mark == CHANGED and TAGGED in event_id:
                event_id, *found = event_id.split(TAGGED)
                tags = frozenset(t for t in found if t) if ours else None
            for kind in sets.values():
                kind.discard(event_id)
            sets[mark].add(event_id)
            if tags is None:
                untagged.add(event_id)
            elif event_id not in untagged:
                out.tags[event_id] = out.tags.get(event_id, frozenset()) | tags
    for event_id in untagged:
        out.tags.pop(event_id, None)
    for event_id in [e for e in out.tags if e not in out.changed]:
        del out.tags[event_id]
    return out
