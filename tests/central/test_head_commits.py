"""Fewer head-row commits (issue 24): a batch with new events decides inside its ingest commit, and the
bookkeeping after it (attempts marked sent, alerts settled) rewrites the `book` row, not the head, so
concurrent instances race on the head once per batch. On Azurite, with the real store code."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest
from azure.data.tables import TableServiceClient

from central.model.events import EventRecord
from central.model.vms import VmState
from central.runtime.inline import all_vms_over, vms_by_name_over
from central.store.fleet_state import Changes, FleetState
from central.store.tables import Conflict, StoreError, TableLog
from sandbox import processes

from .conftest import Env, Hook
from .factory import T0, Vm, body, event


def state_row(env: Env, key: str) -> dict:
    client = env.tables.get_table_client(env.prefix + "State")
    return dict(client.get_entity("fleet", key))


def test_a_batch_with_a_new_event_moves_the_head_once(env: Env, hook: Hook) -> None:
    svc = env.service()
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-once", ["vm-a", "vm-b"])
    result = svc.handle_batch([body(a.heartbeat()), body(b.heartbeat()), body(a.incarnation_env([ev])),
                               body(b.incarnation_env([ev]))], now=T0)
    assert result.approvals_sent == 1 and [d.action for d in result.decisions] == ["approve-after-hook"]
    assert len(env.messages(a.vm_id)) == 1 and len(hook.alerts()) == 1
    # created and decided in one transaction (seq 1); marked sent and its alert settled under `book`
    assert int(state_row(env, "head")["Seq"]) == 1
    assert state_row(env, "book")["Kind"] == "book"
    (row,) = env.rows("Events")
    assert json.loads(row["Approvals"])[0]["sent"] is True and row["PendingAlertCount"] == 0
    assert result.conflicts == 0


def test_sent_marks_and_settled_alerts_share_one_commit(env: Env, hook: Hook) -> None:
    """After the decision's commit, one more: the attempt marked sent and its alert settled together, once
    the Alerts row is written (a wave's calls made two commits there)."""
    svc = env.service()
    a = Vm("vm-a")
    commits: list = []
    commit = svc.state.commit
    svc.state.commit = lambda changes, now, bookkeeping=False, **kw: (  # type: ignore[method-assign]
        commits.append(bookkeeping) or commit(changes, now, bookkeeping=bookkeeping, **kw))
    reports = [body(a.heartbeat()), body(a.incarnation_env([event("E-one", ["vm-a"])]))]
    result = svc.handle_batch(reports, now=T0)
    assert result.approvals_sent == 1 and len(hook.alerts()) == 1
    assert commits == [False, True]  # the decision's (head), then the bookkeeping (book)
    (row,) = env.rows("Events")
    assert json.loads(row["Approvals"])[0]["sent"] is True and row["PendingAlertCount"] == 0
    assert len(env.rows("Alerts")) == 1


def test_what_no_other_decision_reads_moves_no_head(env: Env, hook: Hook) -> None:
    """Issue 24 item 4: the VM's result and its Started report change nothing another event's decision reads
    (fleet_view.seen_by_others): committed under `book`, so another instance neither re-reads the event nor
    loses a race to them; the event's end moves the head again, and the other instance then frees the slot."""
    first, second = env.service(), env.service()
    a = Vm("vm-a")
    ev = event("E-quiet", ["vm-a"])
    first.handle_batch([body(a.heartbeat()), body(a.incarnation_env([ev]))], now=T0)
    (message,) = env.messages(a.vm_id)
    second.state.refresh()
    assert second.state.head_seq == 1 and second.state.active["E-quiet"][0].state == "approving"
    done = first.handle_batch([body(a.result("E-quiet", "approved", message["messageId"]))], now=T0)
    started = first.handle_batch([body(a.incarnation_env([{**ev, "EventStatus": "Started"}]))], now=T0)
    assert done.conflicts == started.conflicts == 0
    assert int(state_row(env, "head")["Seq"]) == 1  # neither moved the head
    (row,) = env.rows("Events")
    assert row["Status"] == "Started" and row["State"] == "approved"
    etag = second.state.head_etag
    second.state.catch_up()
    assert second.state.head_etag == etag and second.state.active["E-quiet"][0].status == "Scheduled"
    first.handle_batch([body(a.incarnation_env([]))], now=T0)  # gone: it no longer counts
    assert int(state_row(env, "head")["Seq"]) == 2
    second.state.catch_up()
    assert "E-quiet" not in second.state.active and second.state.catch_ups["all"] == 0


def test_sends_are_marked_when_the_log_rows_cannot_be_written(env: Env, hook: Hook) -> None:
    """The Alerts rows' write fails after the approval went out: the attempt is still marked sent (no
    second send by the timer), the alert stays owed, and the call fails for the host to retry."""
    svc = env.service()
    a = Vm("vm-a")
    svc.state.refresh()  # the tables exist; then the log store loses one
    env.tables.delete_table(env.prefix + "Alerts")
    with pytest.raises(StoreError):
        svc.handle_batch([body(a.heartbeat()), body(a.incarnation_env([event("E-down", ["vm-a"])]))], now=T0)
    assert len(env.messages(a.vm_id)) == 1
    (row,) = env.rows("Events")
    assert json.loads(row["Approvals"])[0]["sent"] is True and row["PendingAlertCount"] == 1


def test_two_instances_one_decision_when_both_bring_the_event(env: Env, hook: Hook) -> None:
    """Two instances ingest reports of one new event, each deciding inside its commit: the second catches
    up on the head's change log before planning (its cache is a commit behind) and finds the event decided.
    (A commit that loses the race anyway re-reads the same way: test_head_log.py.)"""
    first, second = env.service(), env.service()
    a, b = Vm("vm-a"), Vm("vm-b")
    ev = event("E-both", ["vm-a", "vm-b"])
    first.state.refresh()
    second.state.refresh()  # both caches current before either commits: the second one races
    r1 = first.handle_batch([body(a.heartbeat()), body(a.incarnation_env([ev]))], now=T0)
    r2 = second.handle_batch([body(b.heartbeat()), body(b.incarnation_env([ev]))], now=T0)
    assert r1.approvals_sent + r2.approvals_sent == 1
    assert len(r1.decisions) + len(r2.decisions) == 1
    assert r2.conflicts == 0 and second.state.catch_ups == {"changed": 1, "all": 0}  # read what changed
    assert len(env.messages(a.vm_id)) + len(env.messages(b.vm_id)) == 1


def log_for(azurite: processes.Server) -> TableLog:
    service = TableServiceClient.from_connection_string(azurite.extra["connection_string"])
    log = TableLog(service, "h" + uuid.uuid4().hex[:10])
    log.ensure_tables()
    return log


def test_bookkeeping_moves_no_head_yet_other_caches_see_it(azurite: processes.Server) -> None:
    log = log_for(azurite)
    one, two = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    one.refresh()
    two.refresh()
    now = datetime.now(timezone.utc)
    one.commit(Changes(events={"E1": EventRecord(event_id="E1", first_seen=now),
                               "E2": EventRecord(event_id="E2", first_seen=now)}), now)
    assert two.refresh() and two.head_seq == 1
    mine = one.active["E1"][0]
    mine.pending_alerts = [{"key": "k"}]
    assert one.commit(Changes(events={"E1": mine}), now, bookkeeping=True) == 0
    assert one.head_seq == 1
    # the other instance's decision on another event does not lose a race to the bookkeeping...
    other = two.active["E2"][0]
    other.state = "approving"
    assert two.commit(Changes(events={"E2": other}), now) == 2
    # ...and its cache sees the bookkeeping at the next refresh (the book row moved)
    assert two.refresh() and two.active["E1"][0].pending_alerts == [{"key": "k"}]
    assert not two.refresh()  # nothing moved since
    # the committing instance's own cache re-reads once (others may have written under `book` meanwhile)
    assert one.refresh() and not one.refresh()
    # a bookkeeping change on a row another instance changed still loses (its row's If-Match)
    stale = one.active["E2"][0]
    two.commit(Changes(events={"E2": other}), now)
    with pytest.raises(Conflict):
        one.commit(Changes(events={"E2": stale}), now, bookkeeping=True)


def test_deciding_inside_a_plan_keeps_the_etags_the_plan_was_made_on(azurite: processes.Server) -> None:
    """A decision reads VM rows (liveness) after the plan was made: the plan's VMs must still commit with
    the ETags they were planned on, so a change another instance made meanwhile fails the commit."""
    log = log_for(azurite)
    mine, other = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    mine.commit(Changes(vms={"v1": VmState("v1", "vm-1", last_seen=now)}), now)
    other.load_vms(["v1"])
    theirs = other.vm("v1")
    theirs.forwarder_version = "2.0"  # another instance writes the row meanwhile
    other.commit(Changes(vms={"v1": theirs}), now)
    planned = {"v1": VmState("v1", "vm-1", last_seen=now, forwarder_version="1.0")}  # made on the old row
    assert vms_by_name_over(mine, planned)(["vm-1"])["vm-1"].forwarder_version == "1.0"  # the plan's
    assert [vm.forwarder_version for vm in all_vms_over(mine, planned)()] == ["1.0"]
    with pytest.raises(Conflict):  # its cached ETag is still the one the plan was made on
        mine.commit(Changes(vms=planned), now)


def test_a_name_a_cached_event_was_reported_under_costs_one_read(azurite: processes.Server) -> None:
    """An instance that never read a name's binding tries the VM a cached event says reported under it: one
    read (its VM row), not the name row then the VM row. A VM that lost the name since is not taken for it:
    the name row names the holder."""
    log = log_for(azurite)
    writer, reader = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    now = datetime.now(timezone.utc)
    writer.commit(Changes(vms={"v1": VmState("v1", "vm-1", last_seen=now),
                               "v2": VmState("v2", "vm-2", last_seen=now, name_bound=False),
                               "v3": VmState("v3", "vm-2", last_seen=now)},
                          names={"vm-1": "v1", "vm-2": "v3"}), now)
    writer.commit(Changes(events={"E1": EventRecord("E1", now, resources=["vm-1", "vm-2"],
                                                    reported_by={"vm-1": "v1", "vm-2": "v2"})}), now)
    reader.refresh()
    reads = reader.reads
    assert reader.vms_by_name(["vm-1"])["vm-1"].vm_id == "v1" and reader.reads == reads + 1
    reads = reader.reads
    assert reader.vms_by_name(["vm-2"])["vm-2"].vm_id == "v3"  # v2 reported E1 as vm-2, v3 holds it now
    assert reader.reads == reads + 3  # v2's row (unbound), the name row, v3's row
