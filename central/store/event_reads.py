"""The State table's event rows and head, read into FleetState's cache (a mixin of central.store.fleet_state):
the head and what its log says changed, active rows by key, ended rows (prefetched for a planning attempt, or
read one at a time), and finding an event in either."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import AbstractSet, Any, Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Set, Tuple

from cachetools import LRUCache

from central.model.events import EventRecord, spellings
from central.model.vms import VmState
from central.store import state_rows as rows

from . import head_log
from .tables import TableLog
from .vm_reads import TABLE, Found

ENDED_CACHE = 5_000  # ended events remembered (a miss costs one point read)
CATCH_UP_MIN = 100  # events changed since the cached head: re-read only those, up to max(this, active / 4)


class EventReads:
    store: TableLog
    active: Dict[str, Tuple[EventRecord, str]]  # EventId -> (record, etag of its o: row)
    ended: LRUCache  # event id -> EventRecord
    head_seq: int
    head_etag: Optional[str]
    head_log: Optional[head_log.Log]
    head_vms: Optional[head_log.Log]
    catch_ups: Dict[str, int]
    reads: int
    _absent: Set[str]
    _owed: Set[str]  # ended events whose active rows (kept while alerts are owed) this cache has not read
    # changed events a catch-up did not read, none of whose budget groups it decided in (group_tags): their
    # group tags, and the events by tag; read before a decision counts one of those groups
    _deferred: Dict[str, FrozenSet[str]]
    _deferred_by_tag: Dict[str, Set[str]]
    grouping: Optional[head_log.Tagger]  # the budgets the log is tagged under (None: untagged, as before)
    vms: Dict[str, Tuple[VmState, Optional[str]]]  # central.store.vm_reads
    named: Dict[str, VmState]
    name_release: Optional[timedelta]  # a cached name is trusted for tags this long after its VM spoke
    read_rows: Callable[[Iterable[str]], Found]  # central.store.vm_reads
    _reload_active: Callable[[], None]  # central.store.fleet_state

    def _read_head(self) -> Tuple[Optional[head_log.Head], Optional[str]]:
        """(the head, the book's etag), read now in one query."""
        # a range, not `RowKey eq a or RowKey eq b` (which the service answers by scanning the partition):
        # no row kind sorts between 'book' and 'head' (state_rows.ROW_KINDS; a test holds it)
        found = self.store.query_with_etags(
            TABLE, "PartitionKey eq @p and RowKey ge @book and RowKey le @head",
            {"p": rows.PARTITION, "book": rows.BOOK, "head": rows.HEAD},
        )
        self.reads += 1
        rows_read = {entity.get("RowKey"): (entity, etag) for entity, etag in found}
        head = head_log.Head(*rows_read[rows.HEAD]) if rows.HEAD in rows_read else None
        return head, rows_read[rows.BOOK][1] if rows.BOOK in rows_read else None

    def _changed_since(self, head: Optional[head_log.Head],
                       wanted: Optional[FrozenSet[str]] = None) -> Optional[head_log.Since]:
        """What the head (read now) says changed since the head this cache holds; None when its log does not
        reach back, or names so many events to read (those of groups tagged `wanted`, or untagged; None: all)
        that one read of every active row costs less."""
        if head is None:
            return None
        moved = head.seq > self.head_seq or head.etag == self.head_etag  # (the same seq rewritten: read all)
        since = (head_log.changed_since(head.log, self.head_seq, head.seq, self.fingerprint())
                 if self.head_etag and moved else None)
        if since is None or self.reload_is_cheaper(_to_read(since, wanted)):
            self.catch_ups["all"] += 1
            return None
        return since

    def reload_is_cheaper(self, to_read: int) -> bool:
        """One read of every active row costs less than reading `to_read` events by key."""
        return to_read > max(CATCH_UP_MIN, len(self.active) // 4)

    def fingerprint(self) -> str:
        return self.grouping.fingerprint if self.grouping is not None else ""

    def _catch_up(self, head: Optional[head_log.Head], also: Iterable[str] = (),
                  wanted: Optional[FrozenSet[str]] = None) -> bool:
        """Bring the active cache to `head` (read now) by reading only the events its log says changed since
        the head this cache holds (those of groups tagged `wanted`, and the deferred ones of those groups;
        None: all of them), and `also`. False (nothing done) when the log does not reach back, or there is
        more to read than one read of every active row costs."""
        since = self._changed_since(head, wanted)
        if since is None or head is None:
            return False
        also = set(also)
        self._drop_ended(since, keep=also)
        wanted_now = self._split(since, wanted, also) | also
        if self.reload_is_cheaper(len(wanted_now) - len(also)):
            return False  # (the caller reads every active row, which also clears what was deferred)
        self._read_events(wanted_now)
        self._at_head(head)
        return True

    def _vms_changed_since(self, head: head_log.Head, wanted: Optional[FrozenSet[str]]) -> Set[str]:
        """The VMs the head (read now) says reported the events changed since the head this cache holds
        (head_log.VMS_COLUMN: a hint; empty when it does not reach back), those of groups tagged `wanted`
        (None: all) or untagged."""
        found = head_log.changed_since(head.vms, self.head_seq, head.seq, self.fingerprint())
        if found is None:
            return set()
        return {v for v in found.changed
                if wanted is None or v not in found.tags or not found.tags[v].isdisjoint(wanted)}

    # ---- deferred events (central.policy.group_tags) --------------------------------------------
    def wanted_tags(self, senders: Mapping[str, Mapping[str, Any]],
                    reported: Mapping[str, Iterable[str]]) -> Optional[FrozenSet[str]]:
        """The budget-group tags a plan's decisions will likely count: those of its senders (vmId -> the
        envelope's data.vm; the cached row, else the identity it reports: a VM's groups never change) and of
        the VMs the reported events name (EventId -> the names its document lists). A decision counting
        another group reads it then (StaleGroups). None (read every change) when a name is not known or
        there is no grouping."""
        if self.grouping is None:
            return None
        vms: Dict[str, Optional[VmState]] = {}
        for vm_id, identity in senders.items():
            vm = self.vms[vm_id][0] if vm_id in self.vms else None
            if vm is None:
                vm = VmState(vm_id, str(identity.get("name") or ""))
                vm.bind_identity(dict(identity))
            vms[vm.name] = vm
        named = [vms.get(n) or self.named.get(n) for names in reported.values() for n in names]
        return self.grouping.tags_of([*vms.values(), *named])

    def event_tags(self, rec: EventRecord, planned: Dict[str, VmState],
                   now: datetime) -> Optional[FrozenSet[str]]:
        """The budget-group tags of an event's VMs before and after a change, by the rows a reader's count
        would resolve its names to: the change's own bound VM rows (`planned`, by name), else cached ones
        bound and heard from within `name_release` (a name moves to another vmId only after that long a
        silence). None when a name has neither, or there is no grouping: every reader reads it."""
        if self.grouping is None:
            return None
        names = set(rec.resources)
        cached = self.active.get(rec.event_id)
        if cached is not None:
            names.update(cached[0].resources)
        return self.grouping.tags_of(planned.get(n) or self._holder(n, now) for n in names)

    def _holder(self, name: str, now: datetime) -> Optional[VmState]:
        vm = self.named.get(name)
        if vm is None or self.name_release is None or not vm.name_bound:
            return None
        return vm if vm.heard_since(now - self.name_release) else None

    def _split(self, since: head_log.Since, wanted: Optional[FrozenSet[str]],
               always: AbstractSet[str]) -> Set[str]:
        """The changed events to read now: untagged, of a group tagged `wanted` (None: all), or in `always`;
        the others deferred. Deferred events of a `wanted` group or in `always` are read now too."""
        if wanted is None:
            return set(since.changed) | set(self._deferred)
        now = {e for e in since.changed if e in always or _needed(since, e, wanted)}
        for event_id in since.changed - now:
            self._defer(event_id, since.tags[event_id])
        now |= {e for t in wanted for e in self._deferred_by_tag.get(t, ())}
        now |= {e for e in always if e in self._deferred}
        return now

    def _defer(self, event_id: str, tags: FrozenSet[str]) -> None:
        tags = tags | self._deferred.get(event_id, frozenset())
        self._deferred[event_id] = tags
        for t in tags:
            self._deferred_by_tag.setdefault(t, set()).add(event_id)

    def _undefer(self, event_id: str) -> None:
        for t in self._deferred.pop(event_id, ()):
            ids = self._deferred_by_tag[t]
            ids.discard(event_id)
            if not ids:
                del self._deferred_by_tag[t]

    def stale_tags(self) -> FrozenSet[str]:
        """The group tags some deferred event carries: a decision counting one of those groups must not run
        on this cache before `read_deferred`."""
        return frozenset(self._deferred_by_tag)

    def read_deferred(self, tags: Optional[AbstractSet[str]] = None) -> None:
        """Read the deferred events of groups tagged `tags` (None: all of them); every active row in one read
        when that costs less (a wave's thousands)."""
        wanted = (set(self._deferred) if tags is None
                  else {e for t in tags for e in self._deferred_by_tag.get(t, ())})
        if self.reload_is_cheaper(len(wanted)):
            self._reload_active()
        elif wanted:
            self._read_events(wanted)

    def _hold_head(self, head: head_log.Head) -> None:
        """The cache now holds every event as of `head` (read with them, or its changed events were read)."""
        self.head_seq, self.head_etag, self.head_log, self.head_vms = head.seq, head.etag, head.log, head.vms

    def _at_head(self, head: head_log.Head) -> None:
        """`_hold_head` after a catch-up."""
        self._hold_head(head)
        self.catch_ups["changed"] += 1

    def _drop_ended(self, since: head_log.Since, keep: AbstractSet[str] = frozenset()) -> None:
        """Events another instance ended, dropped unread (but those in `keep`, which the caller reads): a
        decision about another event reads nothing of an ended one. A gone one's ended row is read when
        asked for (find_event, prefetch_ended); one whose active row stays while alerts are owed is
        remembered, and read when something needs its row (`refresh`, find_event, a report of it)."""
        for event_id in (since.gone | since.owed) - keep:
            self.active.pop(event_id, None)
            self._absent.discard(event_id)
            self._owed.discard(event_id)
            self._undefer(event_id)
        self._owed |= since.owed - keep

    def _read_events(self, event_ids: Iterable[str]) -> None:
        """Re-read these events' active rows into the cache; an event with none has ended (its ended row is
        read when asked for: find_event, prefetch_ended)."""
        wanted = set(event_ids)
        self._install_active(wanted, self.read_rows(rows.event_key(e, active=True) for e in wanted))

    def _install_active(self, event_ids: Iterable[str], found: Found) -> None:
        for event_id in event_ids:
            self._absent.discard(event_id)
            self._owed.discard(event_id)
            self._undefer(event_id)
            got = found.get(rows.event_key(event_id, active=True))
            if got is not None:
                self.active[event_id] = (rows.event_from_entity(got[0]), got[1] or "")
            else:
                self.active.pop(event_id, None)

    def prefetch_ended(self, event_ids: Iterable[str]) -> None:
        """Read the ended rows of these events (14 keys per query) and remember which have none: the
        find_event calls of one planning attempt then cost no point read each. The absence is valid for
        this attempt only (`forget_absent`): an event created and ended meanwhile moves the head, so the
        attempt's commit fails and the next attempt reads again."""
        wanted = {e for e in event_ids if e not in self.active and e not in self.ended}
        self._install_ended(wanted, self.read_rows(rows.event_key(e, active=False) for e in wanted))

    def _install_ended(self, event_ids: Iterable[str], found: Found) -> None:
        for event_id in event_ids:
            got = found.get(rows.event_key(event_id, active=False))
            if got is not None:
                self._remember_ended(rows.event_from_entity(got[0]))
            else:
                self._absent.add(event_id)

    def forget_absent(self) -> None:
        self._absent = set()

    def find_event(self, event_id: str) -> Tuple[Optional[EventRecord], bool]:
        """(record, active) for a known event: the active cache, else an ended one (a late report of an
        event that ended any time ago is recognised), else (None, False): new."""
        if event_id in self._owed or event_id in self._deferred:  # its row changed, not read yet
            self._read_events([event_id])
        if event_id in self.active:
            return self.active[event_id][0], True
        if event_id in self.ended:
            return self.ended[event_id], False  # a read keeps it (least recently used goes first)
        if event_id in self._absent:
            return None, False
        got = self.store.get(TABLE, rows.PARTITION, rows.event_key(event_id, active=False))
        self.reads += 1
        if got is None:
            return None, False
        rec = rows.event_from_entity(got[0])
        self._remember_ended(rec)
        return rec, False

    def find_event_any_case(self, event_id: str) -> Tuple[Optional[EventRecord], bool]:
        """find_event for an id an operator typed: Azure's EventIds are upper-case GUIDs, people paste
        them in any case."""
        for candidate in spellings(event_id):
            rec, active = self.find_event(candidate)
            if rec is not None:
                return rec, active
        return None, False

    def _remember_ended(self, rec: EventRecord) -> None:
        self.ended[rec.event_id] = rec  # the oldest goes when full (cachetools)


def _needed(since: head_log.Since, event_id: str, wanted: Optional[FrozenSet[str]]) -> bool:
    """A decision in the groups tagged `wanted` (None: any) may read this changed event: untagged, or tagged
    with one of them."""
    tags = since.tags.get(event_id)
    return wanted is None or tags is None or not tags.isdisjoint(wanted)


def _to_read(since: head_log.Since, wanted: Optional[FrozenSet[str]]) -> int:
    """How many of the changed events a catch-up for groups tagged `wanted` (None: all) reads now."""
    return sum(1 for e in since.changed if _needed(since, e, wanted))
