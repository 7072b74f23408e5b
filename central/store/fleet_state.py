"""The fleet's shared state in the State table, and this instance's cache of it.

The store is the only truth. The cache holds rows with the ETags they were read (or written) with;
every change is written with If-Match on those ETags (or as an insert that fails if the row exists),
so a stale cache can only make a commit fail (`Conflict`), never make it wrong: the caller re-reads
(`refresh`) and decides again. Every change to an event that a decision may read also bumps the `head`
row (If-Match) in the same transaction, so such changes are serialised fleet-wide and a decision that
commits was taken on the current state of every event (budgets count the whole fleet whoever saw the
events). Bookkeeping changes (an attempt marked sent, alerts settled or leased) keep their rows' If-Match
but rewrite the `book` row instead of the head: they cannot change another event's decision, so they
need not make concurrent decisions lose a race; `refresh` watches both rows.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Dict, Iterable, List, Optional, Set, Tuple

from central.model.alert import Alert
from central.model.events import EventRecord
from central.model.vms import VmState
from central.store import state_rows as rows

from . import head_log
from .changes import Changes
from .int64 import plain
from .tables import Conflict, Op, TableLog

__all__ = ["Changes", "FleetState", "EVENTS_PER_COMMIT", "KEYS_PER_QUERY"]

log = logging.getLogger("central.state")  # stable: docs and queries select on it

TABLE = "State"
KEYS_PER_QUERY = 14  # Azure Tables: at most 15 comparisons in one filter
EVENTS_PER_COMMIT = 45  # events changed in one transaction: at most 2 operations each, plus the head
ENDED_CACHE = 5_000  # ended events remembered (a miss costs one point read)
NEVER = datetime.min.replace(tzinfo=timezone.utc)


def _chunks(items: List[str], size: int) -> Iterable[List[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class FleetState:
    def __init__(self, log_store: TableLog) -> None:
        self.store = log_store
        self.vms: Dict[str, Tuple[VmState, Optional[str]]] = {}  # vmId -> (state, etag)
        self.active: Dict[str, Tuple[EventRecord, str]] = {}  # EventId -> (record, etag of its o: row)
        self.ended: OrderedDict[str, EventRecord] = OrderedDict()
        self.head_seq = 0
        self.head_etag: Optional[str] = None
        self.head_log: Optional[head_log.Log] = None  # the head row's change log as last read or written
        self.catch_ups = {"changed": 0, "all": 0}  # re-reads after a moved head: only what changed, or all
        self.book_etag: Optional[str] = None  # the `book` row as last read (bookkeeping commits move it)
        self.loaded = False
        self.reads = 0  # State reads (round trips) since start, for the benchmark
        self.alert_etags: Dict[str, Optional[str]] = {}  # alert rows this instance wrote last
        self.names: Dict[str, Tuple[str, Optional[str]]] = {}  # VM name -> (bound vmId, etag); read ones
        self.named: Dict[str, VmState] = {}  # VM name -> its row as vms_by_name last read it
        self._absent: Set[str] = set()  # EventIds with no ended row, for one planning attempt

    # ---- reads ----------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Make the active-event cache current: one read of the head row, and all active events only
        when the head moved (linear in active events). `force` (after a lost race, when the head has
        most likely moved): the head and the active rows in one query. True when something was reloaded."""
        if force or not self.loaded:
            self._reload_active()
            return True
        # a range, not `RowKey eq a or RowKey eq b` (which the service answers by scanning the partition):
        # no row kind sorts between 'book' and 'head' (state_rows.ROW_KINDS; a test holds it)
        found = self.store.query_with_etags(
            TABLE, "PartitionKey eq @p and RowKey ge @book and RowKey le @head",
            {"p": rows.PARTITION, "book": rows.BOOK, "head": rows.HEAD},
        )
        self.reads += 1
        etags = {entity.get("RowKey"): etag for entity, etag in found}
        if etags.get(rows.HEAD) == self.head_etag and etags.get(rows.BOOK) == self.book_etag:
            return False
        head = next((entity for entity, _ in found if entity.get("RowKey") == rows.HEAD), None)
        if etags.get(rows.BOOK) != self.book_etag or not self._catch_up(head, etags.get(rows.HEAD)):
            self._reload_active()  # bookkeeping moved rows the head log does not name: read them all
        return True

    def _catch_up(self, head: Optional[dict], etag: Optional[str], also: Iterable[str] = ()) -> bool:
        """Bring the active cache to `head` (read now) by reading only the events its log says changed since
        the head this cache holds, and `also`. False (nothing done) when the log does not reach back."""
        if head is None:
            return False
        seq, log_now = int(plain(head.get("Seq"), 0)), head_log.read(head)
        moved = seq > self.head_seq or etag == self.head_etag  # (the same seq rewritten: read everything)
        changed = head_log.changed_since(log_now, self.head_seq, seq) if self.head_etag and moved else None
        if changed is None:
            self.catch_ups["all"] += 1
            return False
        self._read_events(changed | set(also))
        self.head_seq, self.head_etag, self.head_log = seq, etag, log_now
        self.catch_ups["changed"] += 1
        return True

    def _read_events(self, event_ids: Iterable[str]) -> None:
        """Re-read these events' rows (active and ended keys, 7 events per query) into the cache."""
        for chunk in _chunks(sorted(set(event_ids)), KEYS_PER_QUERY // 2):
            keys = [rows.event_key(e, active) for e in chunk for active in (True, False)]
            params = {f"k{i}": k for i, k in enumerate(keys)}
            params["p"] = rows.PARTITION
            where = " or ".join(f"RowKey eq @k{i}" for i in range(len(keys)))
            found = self.store.query_with_etags(TABLE, f"PartitionKey eq @p and ( {where} )", params)
            self.reads += 1
            active: Dict[str, Tuple[EventRecord, str]] = {}
            ended: Dict[str, EventRecord] = {}
            for entity, etag in found:
                rec = rows.event_from_entity(entity)
                if str(entity.get("RowKey", "")).startswith(rows.ACTIVE):
                    active[rec.event_id] = (rec, etag)
                else:
                    ended[rec.event_id] = rec
            for event_id in chunk:
                self._absent.discard(event_id)
                if event_id in active:  # (an o: row wins: it is deleted in the commit that writes x:)
                    self.active[event_id] = active[event_id]
                    continue
                self.active.pop(event_id, None)
                if event_id in ended:
                    self._remember_ended(ended[event_id])

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
        self.active = {}
        head_seen = False
        self.book_etag = None
        for entity, etag in found:
            if entity.get("RowKey") == rows.BOOK:
                self.book_etag = etag
                continue
            if entity.get("RowKey") == rows.HEAD:
                self.head_seq, self.head_etag, head_seen = int(plain(entity.get("Seq"), 0)), etag, True
                self.head_log = head_log.read(entity)
                continue
            rec = rows.event_from_entity(entity)
            self.active[rec.event_id] = (rec, etag)
        if not head_seen:  # a new table: the head starts at 0, so event commits never race to insert it
            self._create_head()
        self.loaded = True

    def _create_head(self) -> None:
        """Insert the head row (seq 0); another instance inserting it first is as good: read its ETag."""
        try:
            head = rows.head_entity(0, datetime.now(timezone.utc))
            head_log.write(head, [])
            etags = self.store.transact(TABLE, [Op("insert", head)])
            self.head_seq, self.head_etag, self.head_log = 0, etags[0], []
            return
        except Conflict:
            pass
        got = self.store.get(TABLE, rows.PARTITION, rows.HEAD)
        self.reads += 1
        if got is None:  # cannot be (a head is never deleted); the first event commit inserts it then
            self.head_seq, self.head_etag = 0, None
        else:
            self.head_seq, self.head_etag = int(plain(got[0].get("Seq"), 0)), got[1]
            self.head_log = head_log.read(got[0])

    def prefetch_ended(self, event_ids: Iterable[str]) -> None:
        """Read the ended rows of these events (14 keys per query) and remember which have none: the
        find_event calls of one planning attempt then cost no point read each. The absence is valid for
        this attempt only (`forget_absent`): an event created and ended meanwhile moves the head, so the
        attempt's commit fails and the next attempt reads again."""
        wanted = sorted({e for e in event_ids if e not in self.active and e not in self.ended})
        for chunk in _chunks(wanted, KEYS_PER_QUERY):
            params = {f"k{i}": rows.event_key(e, active=False) for i, e in enumerate(chunk)}
            params["p"] = rows.PARTITION
            keys = " or ".join(f"RowKey eq @k{i}" for i in range(len(chunk)))
            found = set()
            for entity, _ in self.store.query_with_etags(TABLE, f"PartitionKey eq @p and ( {keys} )", params):
                rec = rows.event_from_entity(entity)
                self._remember_ended(rec)
                found.add(rec.event_id)
            self.reads += 1
            self._absent.update(set(chunk) - found)

    def forget_absent(self) -> None:
        self._absent = set()

    def find_event(self, event_id: str) -> Tuple[Optional[EventRecord], bool]:
        """(record, active) for a known event: the active cache, else an ended one (a late report of an
        event that ended any time ago is recognised), else (None, False): new."""
        if event_id in self.active:
            return self.active[event_id][0], True
        if event_id in self.ended:
            self.ended.move_to_end(event_id)
            return self.ended[event_id], False
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
        for candidate in dict.fromkeys((event_id, event_id.upper(), event_id.lower())):
            rec, active = self.find_event(candidate)
            if rec is not None:
                return rec, active
        return None, False

    def _remember_ended(self, rec: EventRecord) -> None:
        self.ended[rec.event_id] = rec
        while len(self.ended) > ENDED_CACHE:
            self.ended.popitem(last=False)

    def vm(self, vm_id: str) -> Optional[VmState]:
        found = self.vms.get(vm_id)
        return found[0] if found else None

    def load_vms(self, vm_ids: Iterable[str], force: bool = False) -> None:
        """Read the VM rows not cached (or all of them, `force`), 14 keys per query."""
        wanted = sorted({v for v in vm_ids if force or v not in self.vms})
        for chunk in _chunks(wanted, KEYS_PER_QUERY):
            params = {f"k{i}": rows.vm_key(v) for i, v in enumerate(chunk)}
            params["p"] = rows.PARTITION
            filter_ = (
                "PartitionKey eq @p and ( "
                + " or ".join(f"RowKey eq @k{i}" for i in range(len(chunk)))
                + " )"
            )
            found = {
                e["VmId"]: (rows.vm_from_entity(e), etag)
                for e, etag in self.store.query_with_etags(TABLE, filter_, params)
            }
            self.reads += 1
            for vm_id in chunk:
                if vm_id in found:
                    self.vms[vm_id] = found[vm_id]
                else:
                    self.vms.pop(vm_id, None)

    def load_names(self, names: Iterable[str], force: bool = False) -> None:
        """Read the name bindings not cached (or all, `force`), 14 keys per query; an unbound name is
        cached as ("", None)."""
        wanted = sorted({n for n in names if force or n not in self.names})
        for chunk in _chunks(wanted, KEYS_PER_QUERY):
            params = {f"k{i}": rows.name_key(n) for i, n in enumerate(chunk)}
            params["p"] = rows.PARTITION
            keys = " or ".join(f"RowKey eq @k{i}" for i in range(len(chunk)))
            filter_ = f"PartitionKey eq @p and ( {keys} )"  # spaces: the SDK substitutes @names word by word
            rows_found = self.store.query_with_etags(TABLE, filter_, params)
            found = {e["VmName"]: (e["VmId"], etag) for e, etag in rows_found}
            self.reads += 1
            for name in chunk:
                self.names[name] = found.get(name, ("", None))

    def bound_vm(self, name: str) -> str:
        """The vmId bound to `name` ('' when unbound); load_names first."""
        return self.names.get(name, ("", None))[0]

    def vms_by_name(self, names: Iterable[str]) -> Dict[str, VmState]:
        """The current rows of the VMs with these names, read now (liveness any instance saw). Two VMs
        with one name: the one heard from last."""
        wanted = sorted(set(names))
        out: Dict[str, VmState] = {}
        for name in wanted:
            self.named.pop(name, None)
        for chunk in _chunks(wanted, KEYS_PER_QUERY):
            params = {f"n{i}": n for i, n in enumerate(chunk)}
            params["p"] = rows.PARTITION
            # spaces around the parentheses: the SDK substitutes @names word by word
            filter_ = (
                "PartitionKey eq @p and Kind eq 'vm' and ( "
                + " or ".join(f"VmName eq @n{i}" for i in range(len(chunk)))
                + " )"
            )
            for entity, etag in self.store.query_with_etags(TABLE, filter_, params):
                vm = rows.vm_from_entity(entity)
                self.vms[vm.vm_id] = (vm, etag)
                if not vm.name_bound:
                    continue  # its name was taken over by the VM that holds it now
                have = out.get(vm.name)
                if have is None or (vm.last_seen or NEVER) > (have.last_seen or NEVER):
                    out[vm.name] = vm
            self.reads += 1
        self.named.update(out)
        return out

    def all_vms(self) -> List[VmState]:
        found = self.store.query_with_etags(
            TABLE, "PartitionKey eq @p and Kind eq 'vm'", {"p": rows.PARTITION}
        )
        self.reads += 1
        for entity, etag in found:
            vm = rows.vm_from_entity(entity)
            self.vms[vm.vm_id] = (vm, etag)
        return [rows.vm_from_entity(e) for e, _ in found]

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
    def commit(self, changes: Changes, now: datetime, bookkeeping: bool = False) -> int:
        """Write `changes` as one transaction (<= 100 operations); on success the cache holds the new
        rows and ETags. Raises store.Conflict when any row changed since it was read: nothing written,
        and the cache re-read for the next attempt (`_reread_after_lost_race`).
        `bookkeeping`: the event changes are ones no decision about another event reads (an attempt
        marked sent, alerts settled or leased): each event row keeps its If-Match, but the head is not
        bumped, so they never make another instance's decision lose a race (nor lose one to it); the
        `book` row is written instead (unconditionally), so other instances' `refresh` still sees them.
        Returns the head sequence of this commit (0 when the head did not move)."""
        if changes.empty():
            return 0
        ops: List[Op] = []
        owners: List[Tuple[str, str]] = []  # what each op wrote, in op order: ("vm", id), ("event", id)...
        seq = 0
        if changes.events and bookkeeping:
            ops.append(Op("upsert", rows.book_entity(now)))
            owners.append(("book", ""))
        elif changes.events:
            seq = self.head_seq + 1
            head = rows.head_entity(seq, now)
            new_log = head_log.appended(self.head_log, seq, changes.events)
            head_log.write(head, new_log)
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
            stays_active = not rec.ended or bool(rec.pending_alerts)
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
            self.head_log = new_log
        return seq

    def _reread_after_lost_race(self, changes: Changes, kind: str) -> None:
        """Make the cache current for the caller's next attempt: the head and the active rows (one
        request), and the rows of the kind that lost (another instance wrote that VM's row when its
        partition moved, or bound that name); a kind not known: every VM and name row it wrote."""
        found = self.store.query_with_etags(
            TABLE, "PartitionKey eq @p and RowKey ge @book and RowKey le @head",
            {"p": rows.PARTITION, "book": rows.BOOK, "head": rows.HEAD},
        )
        self.reads += 1
        head = next(((e, etag) for e, etag in found if e.get("RowKey") == rows.HEAD), (None, None))
        # the events this commit wrote may have been rewritten by bookkeeping (which the log does not name)
        if not self._catch_up(head[0], head[1], also=changes.events):
            self._reload_active()
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
            elif kind == "vm":
                self.vms[key] = (changes.vms[key], etag)
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
