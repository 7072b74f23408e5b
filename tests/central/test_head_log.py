"""The head row's change log (issue 24): a cache that catches up by reading only the events the log names
ends equal to one that reads every active row, after commits by other instances, lost races, bookkeeping
and a log too short to reach back. On Azurite, with the real store code; and the log's arithmetic."""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta, timezone
from typing import Dict, Tuple

import pytest
from azure.data.tables import TableServiceClient

from central.model.events import EventRecord
from central.model.vms import VmState
from central.runtime.vm_facts import reading_fewer, reusable
from central.store import head_log
from central.store import state_rows as rows
from central.store.fleet_state import KEYS_PER_QUERY, Changes, FleetState
from central.store.tables import Conflict, TableLog
from sandbox import processes


def since(log: object, have: int, now: int) -> object:
    found = head_log.changed_since(log, have, now)  # type: ignore[arg-type]
    return None if found is None else (found.changed, found.gone)


def test_the_log_names_every_commit_since_or_says_it_cannot() -> None:
    log = None
    for seq, (ids, gone) in enumerate(((["A"], []), (["B", "C"], []), (["D"], ["B"])), start=1):
        log = head_log.appended(log, seq, ids, gone=gone)
    assert since(log, 3, 3) == (set(), set())
    assert since(log, 2, 3) == ({"D"}, {"B"})
    assert since(log, 0, 3) == ({"A", "C", "D"}, {"B"})  # the newest mark of an id wins
    assert since(log, 0, 4) is None  # a commit it does not hold
    assert since(log, 4, 3) is None
    assert since(None, 0, 1) is None  # a head written before the log (or by the other version)
    assert since("", 0, 1) is None  # a new head's empty log
    owed = head_log.changed_since(head_log.appended(log, 4, [], owed=["D"]), 2, 4)
    assert owed is not None and (owed.changed, owed.gone, owed.owed) == (set(), {"B"}, {"D"})  # D: + then ~
    entity: dict = {"Seq": 3}
    head_log.write(entity, log)
    head_log.write(entity, head_log.appended(None, 3, ["v9"], head_log.VMS_CHARS), head_log.VMS_COLUMN)
    head = head_log.Head(entity, "etag")
    assert (head.seq, head.log, head.etag) == (3, log, "etag")
    assert head_log.changed_since(head.vms, 2, 3).every() == {"v9"}
    assert head_log.Head({"Seq": 1, "Changed": '[[1, "A"]]'}, None).log is None  # the JSON log before it
    long = None
    for seq in range(1, 200):
        long = head_log.appended(long, seq, [f"E-{seq:04d}-{'x' * 100}"])
    assert len(long) <= head_log.LOG_CHARS and long.endswith("x" * 100)
    assert since(long, 1, 199) is None  # the oldest commits were dropped
    assert since(long, 198, 199) == ({f"E-0199-{'x' * 100}"}, set())
    kept = int(long.split("\t", 1)[0])
    assert since(long, kept - 1, 199) is not None and since(long, kept - 2, 199) is None


def test_a_commit_naming_more_than_the_log_holds_makes_readers_read_everything() -> None:
    """A property holds 32K characters: a line longer than the log's size (an evaluator pass of 45 events
    with many VMs each) is written unreadable, never as a value the store refuses."""
    many = [f"{i:08d}-0000-0000-0000-000000000000" for i in range(900)]
    log = head_log.appended(head_log.appended(None, 1, ["A"]), 2, many, head_log.VMS_CHARS)
    assert len(log) <= head_log.VMS_CHARS and since(log, 1, 2) is None
    assert head_log.changed_since(log, 1, 2) is None
    log = head_log.appended(log, 3, ["B"], head_log.VMS_CHARS)
    assert head_log.changed_since(log, 2, 3).every() == {"B"}  # the commits after it read as before


def test_no_id_can_be_read_as_another() -> None:
    """Ids are split on tabs, never on spaces (an EventId may hold one: split, it named two events that do
    not exist, and the real one was never read again); an id no line can carry makes the reader read all."""
    log = head_log.appended(None, 1, ["A B", "-C"], gone=["+D"])
    assert since(log, 0, 1) == ({"A B", "-C"}, {"+D"})
    for bad in ("x\ty", "x\ny", ""):
        assert since(head_log.appended(log, 2, ["E", bad]), 0, 2) is None
        assert since(head_log.appended(log, 2, ["E"], gone=[bad]), 0, 2) is None


def test_changed_ids_carry_their_groups_tags_under_the_writers_budgets() -> None:
    """central.policy.group_tags: a changed id's tags (`+id#t1#t2`; `+id#` in no group; `+id` not known) are
    read back under the same budgets' fingerprint only; an id changed on several lines carries the union of
    their tags, and untagged on any of them, none (read by everyone)."""
    first = head_log.appended(None, 1, {"E1": frozenset({"a"}), "E2": None, "E3": frozenset()},
                              fingerprint="f1")
    assert head_log.changed_since(first, 0, 1, "f1").tags == {"E1": frozenset({"a"}), "E3": frozenset()}
    log = head_log.appended(first, 2, {"E1": frozenset({"b"}), "E3": None}, fingerprint="f1")
    found = head_log.changed_since(log, 0, 2, "f1")
    assert found is not None and found.changed == {"E1", "E2", "E3"}
    assert found.tags == {"E1": frozenset({"a", "b"})}  # E2 and E3 untagged on a line: read by everyone
    assert head_log.changed_since(log, 1, 2, "f1").tags == {"E1": frozenset({"b"})}
    other = head_log.changed_since(log, 0, 2, "f2")  # another policy's budgets: nothing tagged
    assert other is not None and other.changed == {"E1", "E2", "E3"} and other.tags == {}
    assert head_log.changed_since(log, 0, 2).tags == {}  # a reader with no grouping
    gone = head_log.changed_since(head_log.appended(log, 3, {}, gone=["E1"], fingerprint="f1"), 0, 3, "f1")
    assert gone is not None and gone.gone == {"E1"} and "E1" not in gone.tags
    for bad in ("x#y", ""):  # a Table key cannot hold '#': such an id makes readers read every row
        assert head_log.changed_since(head_log.appended(log, 3, {bad: None}, fingerprint="f1"), 0, 3) is None
    assert head_log.Head({"Seq": 1, "ChangeLog": "1\t+E1"}, None).log is None  # the untagged column before


def cache(state: FleetState) -> Dict[str, Tuple[str, dict]]:
    return {e: (etag, rows.event_entity(rec, True)) for e, (rec, etag) in state.active.items()}


def scanned(log: TableLog) -> Dict[str, Tuple[str, dict]]:
    fresh = FleetState(TableLog(log.service, log.prefix))
    fresh.refresh()
    return cache(fresh)


@pytest.fixture
def log(azurite: processes.Server) -> TableLog:
    service = TableServiceClient.from_connection_string(azurite.extra["connection_string"])
    made = TableLog(service, "g" + uuid.uuid4().hex[:10])
    made.ensure_tables()
    return made


def test_catching_up_on_the_log_equals_a_full_scan(log: TableLog) -> None:
    rng = random.Random(24)  # noqa: S311 - a reproducible mix of commits
    writers = [FleetState(TableLog(log.service, log.prefix)) for _ in range(2)]
    reader = FleetState(TableLog(log.service, log.prefix))
    for state in (*writers, reader):
        state.refresh()
    now = datetime.now(timezone.utc)
    made = 0
    for step in range(40):
        writer = writers[step % 2]
        writer.catch_up()
        changes = Changes()
        for _ in range(rng.randint(1, 3)):  # new events, changed ones, ended ones
            if writer.active and rng.random() < 0.6:
                rec = writer.active[rng.choice(sorted(writer.active))][0]
                rec.state = rng.choice(["approving", "approved", "waiting-budget"])
                if rng.random() < 0.3:
                    rec.end_stale(now)
                changes.events[rec.event_id] = rec
            else:
                made += 1
                changes.events[f"E{made}"] = EventRecord(event_id=f"E{made}", first_seen=now)
        writer.commit(changes, now + timedelta(seconds=step))
        if step % 3 == 0:
            reader.catch_up()
            assert cache(reader) == scanned(log)
    assert reader.catch_ups["changed"] >= 10 and reader.catch_ups["all"] == 0
    reader.catch_up()
    assert cache(reader) == scanned(log)


def test_a_catch_up_by_group_is_current_in_its_groups_and_reads_the_rest_when_asked(log: TableLog) -> None:
    """With the budgets' tags (central.policy.group_tags), a reader planning for scale set a reads every
    changed event of a (and those it reports), defers b's; its a-events equal a full scan's at each step,
    `stale_tags` names b while any is deferred, and a find, `read_deferred` or `refresh` makes it whole."""
    from central.policy.budgets import Budget
    from central.policy.group_tags import Grouping, tag

    grouping = Grouping.of([Budget("ss", "scaleSet", "", 1)])
    rng = random.Random(7)  # noqa: S311 - a reproducible mix of commits
    states = [FleetState(TableLog(log.service, log.prefix)) for _ in range(2)]
    writer, reader = states
    now = datetime.now(timezone.utc)
    vms = {}
    for state in states:
        state.grouping, state.name_release = grouping, timedelta(hours=1)
        state.refresh()
    for i, group in enumerate("ab" * 3):
        vm = VmState(f"v{i}", f"n-{group}{i}", scale_set=group, last_seen=now)
        vms[vm.name] = vm
        writer.commit(Changes(vms={vm.vm_id: vm}), now)
    in_a = {n for n, vm in vms.items() if vm.scale_set == "a"}
    mine, identity = {"v0": "n-a0"}, {"v0": {"name": "n-a0", "vmScaleSetName": "a"}}
    reader.read_for_plan(mine, [], True, wanted=reader.wanted_tags(identity, {}))
    for step in range(30):
        writer.catch_up()
        name = rng.choice(sorted(vms))
        event_id = f"E-{name}-{step % 4}"
        rec = writer.active[event_id][0] if event_id in writer.active else EventRecord(
            event_id=event_id, first_seen=now, resources=[name])
        rec.state = rng.choice(["approving", "approved", "waiting-budget"])
        if rng.random() < 0.2:
            rec.end_stale(now)
        writer.commit(Changes(events={event_id: rec}), now + timedelta(seconds=step))
        reader.read_for_plan(mine, [], True, wanted=reader.wanted_tags(identity, {}))
        want = {e: row for e, row in scanned(log).items() if any(e.startswith(f"E-{n}-") for n in in_a)}
        assert {e: row for e, row in cache(reader).items() if e in want or e.startswith("E-n-a")} == want
    assert reader.stale_tags() == {tag("ss:b")}  # b's events changed, none read
    some = next(iter(reader._deferred))
    assert reader.find_event(some)[0] is not None and some not in reader._deferred  # read when asked for
    reader.read_deferred({tag("ss:b")})
    assert reader.stale_tags() == set() and cache(reader) == scanned(log)
    writer.commit(Changes(events={some: writer.find_event(some)[0]}), now)
    reader.read_for_plan(mine, [], True, wanted=reader.wanted_tags(identity, {}))
    assert reader.stale_tags() == {tag("ss:b")} and reader.refresh() and reader.stale_tags() == set()
    assert cache(reader) == scanned(log)


def test_a_lost_race_rereads_what_changed_and_its_own_rows(log: TableLog) -> None:
    one, two = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    one.refresh()
    one.commit(Changes(events={e: EventRecord(event_id=e, first_seen=now) for e in ("E1", "E2", "E3")}), now)
    two.refresh()
    # bookkeeping on E1 (not in the head's log), then a head commit on E2
    mine = one.active["E1"][0]
    mine.pending_alerts = [{"key": "k"}]
    one.commit(Changes(events={"E1": mine}), now, bookkeeping=True)
    theirs = one.active["E2"][0]
    theirs.state = "approving"
    one.commit(Changes(events={"E2": theirs}), now)
    stale = two.active["E1"][0]
    stale.state = "approved"
    with pytest.raises(Conflict):  # its head (and E1's row) are behind
        two.commit(Changes(events={"E1": stale}), now)
    assert two.catch_ups == {"changed": 1, "all": 0}
    assert cache(two) == scanned(log)  # E2 from the log, E1 because the losing commit wrote it


def test_bookkeeping_is_read_by_refresh_not_by_catch_up(log: TableLog) -> None:
    one, two = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    one.refresh()
    one.commit(Changes(events={"E1": EventRecord(event_id="E1", first_seen=now)}), now)
    two.refresh()
    rec = one.active["E1"][0]
    rec.pending_alerts = [{"key": "k"}]
    one.commit(Changes(events={"E1": rec}), now, bookkeeping=True)
    two.catch_up()
    assert two.active["E1"][0].pending_alerts == []  # catch_up leaves it (its ETag fails a commit)
    assert two.refresh() and cache(two) == scanned(log)  # refresh: the book moved, all re-read


def test_an_event_another_instance_ended_is_dropped_without_a_read(log: TableLog) -> None:
    """The log marks an event that ended: a catch-up drops it unread (most of a wave's catch-up keys were such
    events, issue 24 item 4). One still owed alerts keeps its active row: read when something needs it (the
    timer's refresh, which delivers owed alerts; a report of it; find_event)."""
    one, two = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    one.refresh()
    one.commit(Changes(events={e: EventRecord(event_id=e, first_seen=now) for e in ("E1", "E2")}), now)
    two.refresh()
    ended = one.active["E1"][0]
    ended.end_stale(now)
    one.commit(Changes(events={"E1": ended}), now)
    before = two.reads
    two.catch_up()
    assert two.reads - before == 1 and "E1" not in two.active  # the head's read only
    assert cache(two) == scanned(log) and two.find_event("E1")[0].ended  # its ended row, when asked for
    owed = one.active["E2"][0]
    owed.end_stale(now)
    owed.pending_alerts = [{"key": "k"}]
    one.commit(Changes(events={"E2": owed}), now)
    before = two.reads
    two.catch_up()
    assert two.reads - before == 1 and "E2" not in two.active  # not counted, not read
    assert two.refresh() and two.reads - before == 3  # the head again, then E2's row
    assert two.active["E2"][0].pending_alerts == [{"key": "k"}] and cache(two) == scanned(log)
    assert not two.refresh()  # nothing owed unread any more: the head's read only


def test_an_ended_event_owed_alerts_is_read_when_reported_or_asked_for(log: TableLog) -> None:
    one, two = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    one.refresh()
    one.commit(Changes(events={e: EventRecord(event_id=e, first_seen=now) for e in ("E1", "E2")}), now)
    two.refresh()
    for event_id in ("E1", "E2"):
        rec = one.active[event_id][0]
        rec.end_stale(now)
        rec.pending_alerts = [{"key": event_id}]
        one.commit(Changes(events={event_id: rec}), now)
    two.read_for_plan({}, ["E1"], events_may_change=True)  # a late report of E1
    assert two.active["E1"][0].ended and "E2" not in two.active
    rec, active = two.find_event("E2")  # E2's row as it stands: active, ended, alerts owed
    assert active and rec is not None and rec.ended and rec.pending_alerts == [{"key": "E2"}]
    assert cache(two) == scanned(log)


def test_planning_reads_changed_events_new_vms_names_and_ended_rows_in_one_query(log: TableLog) -> None:
    """read_for_plan: after the head's read, one query holds every kind a planning attempt needs (issue 24
    item 4: it was up to four, one per kind), and the cache ends as the separate reads would leave it."""
    one, two = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    one.refresh()
    one.commit(Changes(events={e: EventRecord(event_id=e, first_seen=now) for e in ("E1", "E2")}), now)
    two.refresh()
    changed, ended = one.active["E1"][0], one.active["E2"][0]
    changed.state = "approving"
    ended.end_stale(now)
    vm = VmState("v1", "n1")
    vm.name_bound = True
    one.commit(Changes(events={"E1": changed, "E2": ended}, vms={"v1": vm}, names={"n1": "v1"}), now)
    before = two.reads
    two.read_for_plan({"v1": "n1", "v2": "n2"}, ["E2", "E9"], events_may_change=True)
    assert two.reads - before == 2  # the head, then o:E1 o:E2 x:E2 x:E9 vm:v1 vm:v2 n:n1 n:n2 in one query
    assert cache(two) == scanned(log) and two.head_etag == one.head_etag
    assert two.vm("v1") is not None and two.vm("v2") is None
    assert two.bound_vm("n1") == "v1" and two.bound_vm("n2") == ""
    assert two.find_event("E2")[0] is not None and two.find_event("E9") == (None, False)
    assert two.reads - before == 2  # E2's ended row was read with the rest, E9's absence remembered
    two.read_for_plan({"v1": "n1"}, [], events_may_change=False)
    assert two.reads - before == 2  # nothing new to read: no query at all


def test_planning_reads_the_vms_of_another_instances_events_in_its_spare_places(log: TableLog) -> None:
    """head_log.VMS_COLUMN (issue 24 item 4): the rows of the VMs that reported the events another instance
    changed ride in the planning query's spare places (never a query of their own), the bound ones as their
    names' holders, so a budget count over those events reads none; a cached row last seen before
    `seen_after` is read again with its event's next change."""
    one, two = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    one.refresh()
    two.refresh()

    def reported(first: int, last: int, at: datetime) -> Changes:
        changes = Changes()
        for i in range(first, last):
            vm = VmState(f"v{i}", f"n{i}")
            vm.name_bound = True
            vm.seen(at)
            changes.vms[vm.vm_id], changes.names[vm.name] = vm, vm.vm_id
            changes.events[f"E{i}"] = EventRecord(event_id=f"E{i}", first_seen=at, resources=[vm.name],
                                                  reported_by={vm.name: vm.vm_id})
        return changes

    one.commit(reported(0, 3, now), now)
    before = two.reads
    two.read_for_plan({"w": "m"}, [], events_may_change=True, seen_after=now - timedelta(seconds=60))
    assert two.reads - before == 2  # the head; vm:w n:m o:E0-E2 and, riding, vm:v0-v2 in one query
    assert {name: vm.vm_id for name, vm in two.named.items()} == {"n0": "v0", "n1": "v1", "n2": "v2"}
    read = reading_fewer(two.vms_by_name, two.named, set(), set(), now, timedelta(seconds=300))
    assert set(read(["n0", "n1", "n2"])) == {"n0", "n1", "n2"} and two.reads - before == 2  # none read

    one.commit(reported(3, 3 + KEYS_PER_QUERY, now), now)  # 14 changed events fill the planning query
    two.read_for_plan({}, [], events_may_change=True, seen_after=now - timedelta(seconds=60))
    assert two.reads - before == 4 and two.vm("v3") is None  # no spare place: no rider, no second query

    later = now + timedelta(seconds=120)
    changes = Changes(events={"E0": one.active["E0"][0]}, vms={"v0": one.vm("v0")})
    changes.events["E0"].state = "approving"
    changes.vms["v0"].seen(later)
    one.commit(changes, later)
    two.read_for_plan({}, [], events_may_change=True, seen_after=later - timedelta(seconds=60))
    assert two.reads - before == 6 and two.vm("v0").last_seen == later  # seen 120 s before: read again
    assert cache(two) == scanned(log)


def test_a_vm_row_read_or_written_holds_its_name_while_bound() -> None:
    """FleetState.cache_vm, the one step every VM row read or committed goes through: a bound row is its
    name's holder (what a pass takes without a read), a row no longer bound or gone stops being one, and
    another VM's hold on the name is left alone."""
    state = FleetState(None)  # type: ignore[arg-type]  # the cache alone: no store call is made
    bound = VmState("v1", "n1")
    state.cache_vm("v1", bound, "e1")
    assert state.named["n1"] is bound
    released = VmState("v1", "n1", name_bound=False)  # read again after another VM took its name over
    state.cache_vm("v1", released, "e2")
    assert "n1" not in state.named and state.vm("v1") is released
    holder = VmState("v2", "n1")
    state.cache_vm("v2", holder, "e3")
    state.cache_vm("v1", None, None)  # v1's row read as gone
    assert state.named["n1"] is holder and state.vm("v1") is None


def test_a_reader_too_far_behind_reads_every_active_row(log: TableLog) -> None:
    one, two = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    one.refresh()
    two.refresh()
    for i in range(0, 400, 40):
        one.commit(Changes(events={f"E-{j:04d}-{'x' * 40}": EventRecord(event_id=f"E-{j:04d}-{'x' * 40}",
                                                                         first_seen=now)
                                   for j in range(i, i + 40)}), now)
    two.catch_up()
    assert two.catch_ups == {"changed": 0, "all": 1} and cache(two) == scanned(log)


def test_cached_vm_rows_are_reused_only_when_a_read_would_not_change_a_budget() -> None:
    now = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
    live = VmState("v1", "vm-1", last_seen=now - timedelta(seconds=30))
    silent = VmState("v2", "vm-2", last_seen=now - timedelta(seconds=400))
    moved = VmState("v3", "vm-3", last_seen=now, name_bound=False)
    liveness = timedelta(seconds=300)
    assert reusable(live, now, liveness)
    assert not reusable(silent, now, liveness)  # it may have spoken since: read it
    assert not reusable(moved, now, liveness) and not reusable(None, now, liveness)
    asked = []

    def read(names):
        asked.append(sorted(names))
        return {n: VmState("fresh-" + n, n, last_seen=now) for n in names}

    cached = {"vm-1": live, "vm-2": silent, "vm-4": live}
    got = reading_fewer(read, cached, fresh={"vm-4"}, keep_out=set(), now=now, liveness=liveness)(
        ["vm-1", "vm-2", "vm-4", "vm-5"])
    assert asked == [["vm-2", "vm-4", "vm-5"]]  # the candidates' (vm-4), the silent and the unknown
    assert got["vm-1"] is live and got["vm-4"].vm_id == "fresh-vm-4"
