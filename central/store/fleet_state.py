"""The fleet's shared state in the State table, and this instance's cache of it.

The store is the only truth. The cache holds rows with the ETags they were read (or written) with;
every change is written with If-Match on those ETags (or as an insert that fails if the row exists),
so a stale cache can only make a commit fail (`Conflict`), never make it wrong: the caller re-reads
(`refresh`) and decides again. Every change to an event that a decision about another event may read
also bumps the `head` row (If-Match) in the same transaction, so such changes are serialised fleet-wide
and a decision that commits was taken on the current state of every event (budgets count the whole fleet
whoever saw the events). Other changes keep their rows' If-Match but rewrite the `book` row instead of the
head: bookkeeping (an attempt marked sent, alerts settled or leased), and what ingest finds leaves
central.policy.fleet_view.seen_by_others as it was (a result, Started); they cannot change another
event's decision, so they need not make concurrent decisions lose a race; `refresh` watches both rows.
The head row also logs the events its last commits changed (central.store.head_log), so a cache behind
it re-reads only those (`catch_up`) instead of every active row.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import AbstractSet, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from cachetools import LRUCache

from central.model.alert import Alert
from central.model.events import EventRecord, spellings
from central.model.times import utcnow
from central.model.vms import VmState
from central.store import state_rows as rows

from . import head_log
from .active_events import ActiveEvents
from .changes import Changes
from .event_reads import ENDED_CACHE, EventReads
from .tables import Conflict, Op, TableLog
from .vm_reads import KEYS_PER_QUERY, TABLE, VmReads

__all__ = ["EVENTS_PER_COMMIT", "KEYS_PER_QUERY", "Changes", "FleetState"]

log = logging.getLogger("central.state")  # stable: docs and queries select on it

EVENTS_PER_COMMIT = 45  # events changed in one transaction: at most 2 operations each, plus the head


class FleetState(EventReads, VmReads):
    def __init__(self, log_store: TableLog) -> None:
        self.store = log_store
        self.vms: Dict[str, Tuple[VmState, Optional[str]]] = {}  # vmId -> (state, etag)
        self.active = ActiveEvents()  # EventId -> (record, etag of its o: row)
        self.ended: LRUCache = LRUCache(maxsize=ENDED_CACHE)  # ended events remembered (event_reads)
        self.head_seq = 0
        self.head_etag: Optional[str] = None
        self.head_log: Optional[head_log.Log] = None  # the head row's change log as last read or written
        self.head_vms: Optional[head_log.Log] = None  # and its log of the VMs that reported those events
        self.catch_ups = {"changed": 0, "all": 0}  # re-reads after a moved head: only what changed, or all
        self.book_etag: Optional[str] = None  # the `book` row as last read (bookkeeping commits move it)
        self.loaded = False
        self.reads = 0  # State reads (round trips) since start, for the benchmark
        self.alert_etags: Dict[str, Optional[str]] = {}  # alert rows this instance wrote last
        self.names: Dict[str, Tuple[str, Optional[str]]] = {}  # VM name -> (bound vmId, etag); read ones
        self.named: Dict[str, VmState] = {}  # VM name -> its holder's row as last read or written
        self._absent: Set[str] = set()  # EventIds with no ended row, for one planning attempt
        self._owed: Set[str] = set()  # ended events with alerts owed, dropped unread (event_reads)
        self._deferred: Dict[str, FrozenSet[str]] = {}  # changed events of groups not decided in
        self._deferred_by_tag: Dict[str, Set[str]] = {}
        self.grouping: Optional[head_log.Tagger] = None  # the budgets the log is tagged under (the service's)
        self.name_release: Optional[timedelta] = None  # central.intake.authz.NAME_RELEASE (the service's)
        self._plan_wanted: Optional[FrozenSet[str]] = None  # the groups the last planning read caught up

    # ---- reads ----------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Make the active-event cache current: one read of the head row, and all active events only
        when the head moved (linear in active events). `force` (after a lost race, when the head has
        most likely moved): the head and the active rows in one query. True when something was reloaded."""
        if force or not self.loaded:
            self._reload_active()
            return True
        head, book = self._read_head()
        if _etag(head) == self.head_etag and book == self.book_etag and not self._owed and not self._deferred:
            return False
        # the owed alerts of ended events dropped unread (the timer delivers them, the views show them), and
        # the changed events deferred (the timer decides in every group)
        if book != self.book_etag or not self._catch_up(head, also=set(self._owed)):
            self._reload_active()  # bookkeeping moved rows the head log does not name: read them all
        return True

    def catch_up(self, also: Iterable[str] = (), wanted: Optional[FrozenSet[str]] = None) -> None:
        """Bring the cache to the current head, reading only the events changed since (the head's log; all
        active rows when it does not reach back), and the events `also`. Rows that bookkeeping rewrote are
        not re-read (a decision about another event does not read what it writes): their ETags make a commit
        on them fail, which re-reads them; `refresh` still sees the book moved and reads everything for the
        views and the timer."""
        if not self.loaded:
            self.refresh()
            return
        head, _ = self._read_head()
        if _etag(head) == self.head_etag and not also:
            return
        if not self._catch_up(head, also, wanted):
            self._reload_active()

    def read_for_plan(self, vm_names: Dict[str, str], reported: Iterable[str],
                      events_may_change: bool, seen_after: Optional[datetime] = None,
                      wanted: Optional[FrozenSet[str]] = None) -> None:
        """What planning a segment reads, in one query after the head's for most segments: `catch_up` (when
        `events_may_change`), the rows of VMs not cached (`vm_names`: vmId -> the name it reports) and the
        name rows of those and of cached VMs not bound to their names, and the ended rows of `reported`
        events neither active nor remembered ended, in each case (`prefetch_ended`). A name row read for a VM
        whose row turns out bound costs nothing more: it rides in the same query. So do, in the query's spare
        places, the rows of the VMs that reported the changed events (head_log.VMS_COLUMN) where this cache
        has none, or one last seen before `seen_after`: a decision counting those events then finds them
        reusable. `wanted`: the budget-group tags the plan's decisions will likely count (None: every group);
        the changed events of other groups are deferred (central.policy.group_tags), and so are their VMs'
        rows."""
        changed: Set[str] = set()
        reported = set(reported)
        at: Optional[head_log.Head] = None
        self._plan_wanted = wanted
        if events_may_change and not self.loaded:
            self.refresh()
        elif events_may_change:
            head, _ = self._read_head()
            if _etag(head) != self.head_etag:
                since = self._changed_since(head, wanted)
                if since is None or head is None:
                    self._reload_active()
                else:
                    self._drop_ended(since)
                    changed, at = self._split(since, wanted, spelled(reported)), head
            elif self._deferred:  # (the head has not moved: deferred events of the groups wanted)
                changed = self._split(head_log.Since(), wanted, spelled(reported))
            if self.reload_is_cheaper(len(changed)):
                self._reload_active()
                changed, at = set(), None
        changed |= self._owed.intersection(reported)  # a report of an ended event: its row, as it stands
        # (and in another case: the platform feed's spelling of an ended event whose alerts are owed)
        changed |= self._owed.intersection(
            other for e in reported if e not in self.active for other in spellings(e)[1:])
        self.forget_absent()
        unknown = {v for v in vm_names if v not in self.vms}
        names = {n for v, n in vm_names.items()
                 if (v in unknown or not self.vms[v][0].name_bound) and n not in self.names}
        ended = {e for e in reported if e not in self.ended and (e not in self.active or e in changed)}
        # an id not open, in none of its cases, may name an ended record in another case (the platform
        # feed's spelling; central.intake.plan's _spelling): those rows too, after the catch-up above
        ended |= {other for e in reported if e not in self.active and e not in self.ended
                  for other in spellings(e)[1:] if other not in self.active and other not in self.ended}
        keys = ([rows.vm_key(v) for v in unknown] + [rows.name_key(n) for n in names]
                + [rows.event_key(e, active=True) for e in changed]
                + [rows.event_key(e, active=False) for e in ended])
        # the VMs of the changed events this cache never read, in the query's spare places only
        spare = -len(keys) % KEYS_PER_QUERY
        hinted = self._vms_changed_since(at, wanted) - unknown if at else set()
        riders = sorted(v for v in hinted if self._stale_vm(v, seen_after))[:spare]
        found = self.read_rows(keys + [rows.vm_key(v) for v in riders])
        self.install_vms(unknown, found)
        self.install_vms(riders, found)
        self.install_names(names, found)
        self._install_active(changed, found)
        self._install_ended(ended, found)
        if at is not None:
            self._at_head(at)

    def _stale_vm(self, vm_id: str, seen_after: Optional[datetime]) -> bool:
        """Worth a rider's place: not cached, or cached as last heard from before `seen_after`."""
        cached = self.vms.get(vm_id)
        return cached is None or (seen_after is not None and not cached[0].heard_since(seen_after))

    def ensure_loaded(self) -> None:
        if not self.loaded:
            self.refresh()

    def _reload_active(self) -> None:
        """The active rows, with the book and head rows read first ('book' < 'head' < 'o:'; a transaction
        is atomic, so rows newer than those reads can only make a commit fail or a refresh re-read)."""
        found = self.store.query_with_etags(
            TABLE,
            "PartitionKey eq @p and ( RowKey eq @book or RowKey eq @head"
            " or ( RowKey ge @lo and RowKey lt @hi ) )",
            {"p": rows.PARTITION, "book": rows.BOOK, "head": rows.HEAD, "lo": rows.ACTIVE,
             "hi": rows.ACTIVE[:-1] + chr(ord(rows.ACTIVE[-1]) + 1)},
        )
        self.reads += 1
        fresh: Dict[str, Tuple[EventRecord, str]] = {}
        head_seen = False
        self.book_etag = None
        for entity, etag in found:
            if entity.get("RowKey") == rows.BOOK:
                self.book_etag = etag
                continue
            if entity.get("RowKey") == rows.HEAD:
                self._hold_head(head_log.Head(entity, etag))
                head_seen = True
                continue
            cached = self.active.get(entity.get("EventId", ""))
            if cached is not None and etag and cached[1] == etag:  # the very row cached: not parsed again
                fresh[cached[0].event_id] = cached
            else:
                rec = rows.event_from_entity(entity)
                fresh[rec.event_id] = (rec, etag)
        self.active.replace_all(fresh)
        self._owed = set()
        self._deferred, self._deferred_by_tag = {}, {}
        if not head_seen:  # a new table: the head starts at 0, so event commits never race to insert it
            self._create_head()
        self.loaded = True

    def _create_head(self) -> None:
        """Insert the head row (seq 0); another instance inserting it first is as good: read its ETag."""
        try:
            head = rows.head_entity(0, utcnow())
            head_log.write(head, "")
            head_log.write(head, "", head_log.VMS_COLUMN)
            etags = self.store.transact(TABLE, [Op("insert", head)])
            self._hold_head(head_log.Head(head, etags[0]))
            return
        except Conflict:
            pass
        got = self.store.get(TABLE, rows.PARTITION, rows.HEAD)
        self.reads += 1
        if got is None:  # cannot be (a head is never deleted); the first event commit inserts it then
            self.head_seq, self.head_etag = 0, None
        else:
            self._hold_head(head_log.Head(*got))

    def due_alert_rows(self, now: datetime) -> List[Tuple[Alert, str]]:
        """Alerts owed by no event whose next try is due (at-least-once delivery, any instance)."""
        found = self.store.query_with_etags(
            TABLE,
            "PartitionKey eq @p and RowKey ge @lo and RowKey lt @hi and NextTry le @now",
            {"p": rows.PARTITION, "lo": rows.ALERT, "hi": "a;", "now": now},
        )
        self.reads += 1
        out = []
        for entity, etag in found:
            alert = rows.alert_from_row(entity)
            if alert is not None:
                out.append((alert, etag))
        return out

    # ---- writes ---------------------------------------------------------------------------------
    def commit(self, changes: Changes, now: datetime, bookkeeping: bool = False,
               unseen: AbstractSet[str] = frozenset()) -> int:
        """Write `changes` as one transaction (<= 100 operations); on success the cache holds the new
        rows and ETags. Raises store.Conflict when any row changed since it was read: nothing written,
        and the cache re-read for the next attempt (`_reread_after_lost_race`).
        `bookkeeping`: the event changes are ones no decision about another event reads (an attempt
        marked sent, alerts settled or leased): each event row keeps its If-Match, but the head is not
        bumped, so they never make another instance's decision lose a race (nor lose one to it); the
        `book` row is written instead (unconditionally), so other instances' `refresh` still sees them.
        `unseen`: events whose change no decision about another event reads either (the caller knows:
        central.runtime.ingest): left out of the head's log, and a commit of only those is bookkeeping.
        Returns the head sequence of this commit (0 when the head did not move)."""
        if changes.empty():
            return 0
        ops: List[Op] = []
        owners: List[Tuple[str, str]] = []  # what each op wrote, in op order: ("vm", id), ("event", id)...
        seq = 0
        seen = [e for e in changes.events if e not in unseen]
        if changes.events and (bookkeeping or not seen):
            ops.append(Op("upsert", rows.book_entity(now)))
            owners.append(("book", ""))
        elif changes.events:
            seq = self.head_seq + 1
            head = rows.head_entity(seq, now)
            # readers drop ended events unread (a decision about another event reads nothing of them)
            gone = {e for e in seen if not _stays_active(changes.events[e])}
            owed = {e for e in seen if e not in gone and changes.events[e].ended}
            planned = {vm.name: vm for vm in changes.vms.values() if vm.name_bound}
            tags = {e: self.event_tags(changes.events[e], planned, now) for e in seen if e not in gone | owed}
            fingerprint = self.fingerprint()
            new_log = head_log.appended(self.head_log, seq, tags, gone=gone, owed=owed,
                                        fingerprint=fingerprint)
            head_log.write(head, new_log)
            reporters: Dict[str, head_log.Tags] = {}
            for event_id, event_tags in tags.items():  # (a VM's tags: its events' groups)
                for vm_id in changes.events[event_id].reported_by.values():
                    had = reporters.get(vm_id, frozenset())
                    reporters[vm_id] = None if had is None or event_tags is None else had | event_tags
            new_vms = head_log.appended(self.head_vms, seq, reporters, head_log.VMS_CHARS,
                                        fingerprint=fingerprint)
            head_log.write(head, new_vms, head_log.VMS_COLUMN)
            ops.append(Op("replace", head, self.head_etag) if self.head_etag else Op("insert", head))
            owners.append(("head", ""))
        for vm_id, vm in changes.vms.items():
            entity = rows.vm_entity(vm)
            cached = self.vms.get(vm_id)
            etag = cached[1] if cached else None
            ops.append(Op("replace", entity, etag) if etag else Op("insert", entity))
            owners.append(("vm", vm_id))
        for event_id, rec in changes.events.items():
            was_active = event_id in self.active
            stays_active = _stays_active(rec)
            if was_active and stays_active:
                ops.append(Op("replace", rows.event_entity(rec, True), self.active[event_id][1]))
            elif was_active:
                ops.append(
                    Op(
                        "delete",
                        {"PartitionKey": rows.PARTITION, "RowKey": rows.event_key(event_id, True)},
                        self.active[event_id][1],
                    )
                )
                owners.append(("gone", event_id))
                ops.append(Op("upsert", rows.event_entity(rec, False)))
            elif event_id in self.ended and rec.ended:  # an ended row corrected (the platform's exact end)
                ops.append(Op("upsert", rows.event_entity(rec, False)))
            else:  # new (an ended event never comes back to life)
                ops.append(Op("insert", rows.event_entity(rec, stays_active)))
            owners.append(("event", event_id))
        for alert in changes.alerts:
            ops.append(Op("upsert", rows.alert_row(alert)))
            owners.append(("alert", alert.key))
        for name, vm_id in changes.names.items():
            entity = rows.name_entity(name, vm_id, now)
            etag = self.names.get(name, ("", None))[1]
            ops.append(Op("replace", entity, etag) if etag else Op("insert", entity))  # one holder at a time
            owners.append(("name", name))
        try:
            etags = self.store.transact(TABLE, ops)
        except Conflict as exc:
            found = owners[exc.index] if 0 <= exc.index < len(owners) else ("", "")
            exc.what = found  # type: ignore[attr-defined]  # what lost the race: ("head", "") | ("vm", id) ...
            self._reread_after_lost_race(changes, found[0])
            raise
        self._install(changes, owners, etags, seq)
        if seq:
            self.head_log, self.head_vms = new_log, new_vms
        return seq

    def _reread_after_lost_race(self, changes: Changes, kind: str) -> None:
        """Make the cache current for the caller's next attempt: the events changed since the cached head
        and the ones this commit wrote (`catch_up`), and the rows of the kind that lost (another instance
        wrote that VM's row when its partition moved, or bound that name); a kind not known: every VM and
        name row it wrote."""
        # its events may have been rewritten by bookkeeping, which the log does not name
        self.catch_up(also=changes.events, wanted=self._plan_wanted)
        if kind not in ("head", "book", "event", "gone", "name"):
            self.load_vms(changes.vms, force=True)
        if kind not in ("head", "event", "gone", "vm"):
            self.load_names(changes.names, force=True)

    def _install(
        self, changes: Changes, owners: List[Tuple[str, str]], etags: List[Optional[str]], seq: int
    ) -> None:
        for (kind, key), etag in zip(owners, etags):
            if kind == "book":
                # not installed: rows other instances wrote under `book` since this cache read it are not
                # in this cache, so the next refresh must still see the book moved and re-read
                continue
            if kind == "head":
                self.head_etag, self.head_seq = etag, seq
            elif kind == "vm":  # the row as committed: as current as a read
                self.cache_vm(key, changes.vms[key], etag)
            elif kind == "alert":
                self.alert_etags[key] = etag
            elif kind == "name":
                self.names[key] = (changes.names[key], etag)
            elif kind == "event":
                rec = changes.events[key]
                if not rec.ended or rec.pending_alerts:
                    self.active[key] = (rec, etag or "")
                else:
                    self.active.pop(key, None)
                    self._remember_ended(rec)

    def forget_alert_row(self, alert: Alert, etag: str) -> None:
        """An alert owed by no event was delivered or given up: its row goes (If-Match; a row another
        instance already removed, or is retrying, stays as it is)."""
        entity = {"PartitionKey": rows.PARTITION, "RowKey": rows.alert_key(alert.key)}
        try:
            self.store.transact(TABLE, [Op("delete", entity, etag)])
        except Conflict:
            pass

    def touched_vm_ids(self, changes: Changes) -> Set[str]:
        return set(changes.vms)


def spelled(event_ids: Iterable[str]) -> Set[str]:
    """These EventIds in each of their cases."""
    return {other for e in event_ids for other in spellings(e)}


def _stays_active(rec: EventRecord) -> bool:
    """Its row is an active one after the commit (an ended event keeps it while alerts are owed)."""
    return not rec.ended or bool(rec.pending_alerts)


def _etag(head: Optional[head_log.Head]) -> Optional[str]:
    return head.etag if head is not None else None
