"""The store on Azurite: State transactions all or nothing under ETags, log rows one request per
partition chunk, a refused row set aside (never retried forever), the wire path equal to the SDK's."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.data.tables import EdmType, TableServiceClient, UpdateMode

from central.runtime.settings import CountingTransport
from central.store import batch_wire
from central.store.tables import Conflict, Op, Rejected, TableLog
from sandbox import processes


def log_for(azurite: processes.Server) -> TableLog:
    transport = CountingTransport()
    service = TableServiceClient.from_connection_string(
        azurite.extra["connection_string"], transport=transport
    )
    log = TableLog(service, "s" + uuid.uuid4().hex[:10])
    log.ensure_tables()
    return log


def test_one_request_per_partition_chunk_and_merged_duplicates(azurite: processes.Server) -> None:
    log = log_for(azurite)
    transport = log.service._client._client._pipeline._transport  # the CountingTransport
    assert isinstance(transport, CountingTransport)
    before = transport.requests
    for i in range(150):
        log.stage(
            "Incarnations", {"PartitionKey": "2026-11-21", "RowKey": f"r{i:03d}", "N": i, "Name": "o'brien"}
        )
    log.stage("Incarnations", {"PartitionKey": "2026-11-21", "RowKey": "r000", "Extra": True})  # merges
    log.stage("Decisions", {"PartitionKey": "2026-11-21", "RowKey": "a", "Seen": 1})
    assert log.flush() == 3  # 100 + 50 rows, and one Decisions row
    assert transport.requests - before == 3
    rows = list(log.client("Incarnations").list_entities())
    assert len(rows) == 150
    first = next(r for r in rows if r["RowKey"] == "r000")
    assert first["Extra"] is True and first["N"] == 0 and first["Name"] == "o'brien"


def test_a_refused_log_row_is_set_aside_and_the_others_written(azurite: processes.Server) -> None:
    log = log_for(azurite)
    log.stage("Decisions", {"PartitionKey": "2026-11", "RowKey": "ok", "A": 1})
    log.stage("Decisions", {"PartitionKey": "2026-11", "RowKey": "bad", "Huge": "x" * 70_000})  # > 64 KiB
    log.stage("Decisions", {"PartitionKey": "2026-11", "RowKey": "ok2", "A": 2})
    assert log.flush() == 2  # the halves without the bad row
    assert log.staged_count == 0  # nothing kept to fail again at every later flush
    (problem,) = log.take_rejected()
    assert "bad" in problem and "PropertyValueTooLarge" in problem
    assert sorted(r["RowKey"] for r in log.client("Decisions").list_entities()) == ["ok", "ok2"]
    assert log.flush() == 0 and log.take_rejected() == []


def test_state_transactions_are_all_or_nothing_under_etags(azurite: processes.Server) -> None:
    log = log_for(azurite)
    row = {"PartitionKey": "fleet", "RowKey": "head", "Seq": 1}
    (etag,) = log.transact("State", [Op("insert", row)])
    with pytest.raises(Conflict) as lost:  # someone else inserted it first
        log.transact("State", [Op("upsert", {"PartitionKey": "fleet", "RowKey": "x"}), Op("insert", row)])
    assert lost.value.index == 1 and lost.value.status == 409
    assert log.get("State", "fleet", "x") is None  # all or nothing
    etags = log.transact(
        "State",
        [
            Op("replace", dict(row, Seq=2), etag),
            Op("insert", {"PartitionKey": "fleet", "RowKey": "o:E1", "A": 1}),
        ],
    )
    with pytest.raises(Conflict) as stale:  # the old ETag: the row changed since it was read
        log.transact("State", [Op("replace", dict(row, Seq=3), etag)])
    assert stale.value.status == 412
    entity, now_etag = log.get("State", "fleet", "head")
    assert entity["Seq"] == 2 and now_etag == etags[0]
    with pytest.raises(Rejected):
        log.transact("State", [Op("upsert", {"PartitionKey": "fleet", "RowKey": "big", "B": "x" * 70_000})])
    assert log.transact("State", [Op("delete", {"PartitionKey": "fleet", "RowKey": "o:E1"}, etags[1])]) == [
        None
    ]
    assert log.get("State", "fleet", "o:E1") is None


def test_the_wire_transaction_stores_what_submit_transaction_stores(azurite: processes.Server) -> None:
    """central/store/batch_wire.py is a hand-written fast path beside the SDK's submit_transaction: the same
    entities written both ways must read back identical, whatever the keys and value types, and the
    conditional operations must answer the same ETags and refuse the same stale ones."""
    log = log_for(azurite)
    keys = ["plain", "o'brien", "with space", "per%cent", "plus+sign", "ünïcødé-名前", "semi;colon", "a&b=c"]
    when = datetime(2026, 11, 21, 4, 32, 1, 123000, tzinfo=timezone.utc)

    def entities(partition: str) -> list:
        return [
            {
                "PartitionKey": partition,
                "RowKey": key,
                "Text": f'value {key} "quoted" \n newline',
                "Int": 2**30,
                "Small": -3,
                "Float": 1.5,
                "Bool": False,
                "When": when,
                "Empty": "",
            }
            for key in keys
        ]

    client = log.client("Incarnations")
    batch_wire.upsert_merge(client, entities("wire"))
    client.submit_transaction([("upsert", e, {"mode": UpdateMode.MERGE}) for e in entities("sdk")])

    def read(partition: str) -> dict:
        rows = client.query_entities("PartitionKey eq @p", parameters={"p": partition})
        return {r["RowKey"]: {k: v for k, v in r.items() if k != "PartitionKey"} for r in rows}

    wire, sdk = read("wire"), read("sdk")
    assert sorted(wire) == sorted(keys)
    assert wire == sdk
    for how, run in (
        ("wire", lambda ops: batch_wire.transact(client, [(o.kind, o.entity, o.etag) for o in ops])),
        ("sdk", lambda ops: TableLog._sdk_transact(client, ops)),
    ):
        first = run([Op("insert", {"PartitionKey": how, "RowKey": "cond", "N": 1})])
        current = client.get_entity(how, "cond").metadata["etag"]
        assert first == [current]
        second = run([Op("replace", {"PartitionKey": how, "RowKey": "cond", "N": 2}, current)])
        assert second == [client.get_entity(how, "cond").metadata["etag"]]
        with pytest.raises((batch_wire.WireBatchError, Conflict)):
            run([Op("merge", {"PartitionKey": how, "RowKey": "cond", "N": 3}, current)])
        assert client.get_entity(how, "cond")["N"] == 2


def test_a_new_state_table_gets_one_head_whichever_instance_reads_first(azurite: processes.Server) -> None:
    from central.store.fleet_state import FleetState

    first = log_for(azurite)
    second = TableLog(first.service, first.prefix)  # another instance on the same tables
    one, two = FleetState(first), FleetState(second)
    assert one.refresh() and two.refresh()
    assert one.head_etag and one.head_etag == two.head_etag  # the second found the first's head
    assert one.head_seq == two.head_seq == 0
    assert [e["RowKey"] for e in first.query("State", "PartitionKey eq 'fleet'")] == ["head"]


def test_a_lost_commit_leaves_the_cache_current_with_two_reads(azurite: processes.Server) -> None:
    """A commit that loses a race re-reads the head, then the rows its log says changed and the commit's own
    (one query for up to 14), before it raises, so the caller's next attempt is current (the callers only
    plan or decide again)."""
    from central.model.events import EventRecord
    from central.store.fleet_state import Changes, FleetState

    log = log_for(azurite)
    mine, other = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    mine.refresh()
    other.refresh()
    now = datetime.now(timezone.utc)
    other.commit(Changes(events={"E1": EventRecord(event_id="E1", first_seen=now)}), now)
    transport = log.service._client._client._pipeline._transport  # the CountingTransport
    before = transport.requests
    with pytest.raises(Conflict) as lost:  # my head is stale: the commit loses
        mine.commit(Changes(events={"E2": EventRecord(event_id="E2", first_seen=now)}), now)
    assert lost.value.what == ("head", "")
    assert transport.requests - before == 3  # the refused transaction, the head, E1 and E2's rows
    assert set(mine.active) == {"E1"} and mine.head_seq == other.head_seq == 1
    mine.commit(Changes(events={"E2": EventRecord(event_id="E2", first_seen=now)}), now)  # current now
    assert mine.head_seq == 2


def test_a_record_another_instance_wrote_is_read_back_with_plain_times(
        azurite: processes.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads an Edm.DateTime as its own datetime subclass; a record read back from the store (every
    change another instance made) holds plain datetimes, so planning copies it on central.model.clone's fast
    path, not copy.deepcopy's (issue 24: copies of such records cost twice as much). Both ways rows come back:
    a query (batch_wire parses the times itself) and a point read (the SDK's get_entity: state_rows._dt)."""
    import copy

    from central.model.clone import clone_event
    from central.model.events import EventRecord
    from central.store.fleet_state import Changes, FleetState

    log = log_for(azurite)
    mine, other = FleetState(log), FleetState(TableLog(log.service, log.prefix))
    mine.refresh()
    other.refresh()
    now = datetime(2026, 11, 26, 20, 0, 0, 123456, tzinfo=timezone.utc)
    rec = EventRecord(event_id="E1", first_seen=now)
    rec.absorb({"EventId": "E1", "EventType": "Reboot", "Resources": ["vm-a"], "EventStatus": "Scheduled",
                "NotBefore": "Thu, 26 Nov 2026 20:15:00 GMT", "DurationInSeconds": -1}, "id-a", "vm-a", now)
    other.commit(Changes(events={"E1": rec}), now)
    mine.catch_up()
    read = mine.active["E1"][0]
    assert read.first_seen == now and read.not_before == datetime(2026, 11, 26, 20, 15, tzinfo=timezone.utc)
    assert type(read.first_seen) is datetime and type(read.not_before) is datetime
    gone = EventRecord(event_id="E2", first_seen=now)
    gone.absorb({"EventId": "E2", "EventType": "Reboot", "Resources": ["vm-b"], "EventStatus": "Scheduled",
                 "NotBefore": "", "DurationInSeconds": -1}, "id-b", "vm-b", now)
    gone.end_stale(now)
    other.commit(Changes(events={"E2": gone}), now)
    ended, active = mine.find_event("E2")  # its ended row, by a point read
    assert ended is not None and not active and ended.ended_at == now
    assert type(ended.first_seen) is datetime and type(ended.ended_at) is datetime

    def no_deepcopy(value: object, memo: object = None) -> object:
        raise AssertionError(f"copy.deepcopy({type(value).__name__}) on a record read back")

    monkeypatch.setattr(copy, "deepcopy", no_deepcopy)
    assert clone_event(read) == read and clone_event(ended) == ended


def test_the_wire_query_reads_what_query_entities_reads(azurite: processes.Server) -> None:
    """batch_wire.query (TableLog.query_with_etags) beside the SDK's query_entities: the same entities, value
    types, ETags and metadata, page after page, with $select, and the same refusal of a bad filter."""
    log = log_for(azurite)
    client = log.client("State")
    when = datetime(2026, 11, 21, 4, 32, 1, 123000, tzinfo=timezone.utc)
    rows = [{"PartitionKey": "p", "RowKey": f"r{i:03d}'q", "Text": f"t {i} \u540d", "Int": i,
             "Big": (2**40 + i, EdmType.INT64), "Float": 0.5 + i, "Bool": i % 2 == 0, "When": when,
             "Guid": uuid.UUID(int=i), "Bytes": bytes([i % 256]) * 3, "Empty": ""} for i in range(23)]
    for i in range(0, len(rows), 10):
        batch_wire.transact(client, [("insert", row, None) for row in rows[i:i + 10]])

    def sdk(filter_: str, parameters: dict, select: object = None, per_page: int = 1000) -> list:
        found = client.query_entities(filter_, parameters=parameters, select=select,
                                      results_per_page=per_page)
        return [(dict(e), e.metadata) for e in found]

    def wire(filter_: str, parameters: dict, select: object = None, per_page: int = 1000) -> list:
        found = batch_wire.query(client, filter_, parameters, select, per_page)
        return [(dict(e), e.metadata) for e in found]

    every = ("PartitionKey eq @p and RowKey ge @lo", {"p": "p", "lo": "r"})
    assert len(wire(*every)) == 23 and wire(*every) == sdk(*every)
    assert wire(*every, per_page=5) == sdk(*every)  # five pages, continued by the service's tokens
    assert wire(*every, select=["Int", "When"]) == sdk(*every, select=["Int", "When"])
    keys = ("PartitionKey eq @p and ( RowKey eq @a or RowKey eq @b )", {"p": "p", "a": "r003'q", "b": "r999"})
    assert [e["Int"] for e, _ in wire(*keys)] == [3] and wire(*keys) == sdk(*keys)
    # keys the URL must carry whole: '&' would cut the filter, '%27' become a quote, '+' a space
    odd = ["a&b", "a%27b", "a+b c", "a%b", "a=b;c", "ünï名"]
    batch_wire.transact(client, [("insert", {"PartitionKey": "odd", "RowKey": k, "Key": k}, None)
                                 for k in odd])
    for key in odd:
        one = ("PartitionKey eq @p and RowKey eq @k", {"p": "odd", "k": key})
        assert [e["Key"] for e, _ in wire(*one)] == [key] and wire(*one) == sdk(*one)
    with pytest.raises(HttpResponseError) as refused_wire:
        batch_wire.query(client, "PartitionKey eq", {})
    with pytest.raises(HttpResponseError) as refused_sdk:
        client.query_entities("PartitionKey eq").next()
    assert refused_wire.value.status_code == refused_sdk.value.status_code == 400
    missing = log.service.get_table_client("missing" + uuid.uuid4().hex[:8])
    with pytest.raises(ResourceNotFoundError):
        batch_wire.query(missing, "PartitionKey eq 'p'", {})
    with pytest.raises(ResourceNotFoundError):
        missing.query_entities("PartitionKey eq 'p'").next()
    assert log.query_with_etags("State", *keys) == [(e, m["etag"]) for e, m in sdk(*keys)]
    # without the Timestamp parsed (query_with_etags keeps only the ETag): the same entities and ETags
    bare = [(dict(e), e.metadata) for e in batch_wire.query(client, *every, timestamps=False)]
    assert [e for e, _ in bare] == [e for e, _ in sdk(*every)]
    assert [m["etag"] for _, m in bare] == [m["etag"] for _, m in sdk(*every)]
    assert all(m["timestamp"] is None for _, m in bare) and all(m["timestamp"] for _, m in sdk(*every))
    # times: equal to the SDK's datetime subclass, but plain datetimes (fromisoformat, not strptime)
    assert all(type(e["When"]) is datetime and e["When"] == when for e, _ in wire(*every))
    assert all(type(e["When"]) is not datetime for e, _ in sdk(*every))


def test_a_time_fromisoformat_cannot_read_is_left_to_the_sdk() -> None:
    """batch_wire.plain_times parses the service's Edm.DateTime texts; one it cannot read (strptime reads
    unpadded fields, fromisoformat does not) keeps its annotation, so the SDK's converter still parses it."""
    from azure.data.tables._deserialize import _convert_to_entity

    entity = {"odata.etag": "W/\"x\"", "PartitionKey": "p", "RowKey": "r",
              "Timestamp@odata.type": "Edm.DateTime", "Timestamp": "2026-11-26T20:00:00.1234567Z",
              "A@odata.type": "Edm.DateTime", "A": "2026-11-26T20:00:00.1234567Z",
              "B@odata.type": "Edm.DateTime", "B": "2026-1-5T1:2:3Z", "C": "2026-11-26T20:00:00Z"}
    batch_wire.plain_times(entity)
    assert entity["A"] == datetime(2026, 11, 26, 20, 0, 0, 123456, tzinfo=timezone.utc)
    assert "A@odata.type" not in entity
    assert entity["B@odata.type"] == "Edm.DateTime" and entity["Timestamp"] == "2026-11-26T20:00:00.1234567Z"
    converted = _convert_to_entity(entity)
    assert type(converted["A"]) is datetime
    assert converted["B"] == datetime(2026, 1, 5, 1, 2, 3, tzinfo=timezone.utc)
    assert type(converted["B"]) is not datetime
    assert converted["C"] == "2026-11-26T20:00:00Z"  # a string property stays a string
