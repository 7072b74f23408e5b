"""bench.table_memory (the wave simulation's in-memory Tables/Queues) answers as Azurite does for what
central uses: the same operations, through the real SDKs and central.store, against Azurite, the
stand-in in-process and the stand-in over loopback HTTP; the observations must be equal."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
from azure.core.exceptions import ResourceExistsError
from azure.data.tables import EdmType, EntityProperty

from bench import odata_filter as odata
from bench import table_memory_net as net
from bench.table_memory import MemoryStorage
from central.runtime.approval_queue import ApprovalSender
from central.runtime.settings import CountingTransport, storage_clients
from central.store.tables import Conflict, Op, TableLog
from sandbox import processes

T = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def _value(v: Any) -> Any:
    if isinstance(v, EntityProperty):
        return (v.value, str(v.edm_type))
    if isinstance(v, datetime):
        return v.isoformat()
    return v


class Observer:
    """What a scenario saw, with each row's ETags replaced by their order of first appearance (values
    differ between services, and Azurite gives the rows of one batch one ETag; a row's ETag staying or
    changing is what central relies on)."""

    def __init__(self) -> None:
        self.seen: List[Any] = []
        self.etags: Dict[str, int] = {}

    def etag(self, e: Optional[str], row: str = "head") -> Any:
        return None if e is None else self.etags.setdefault(f"{row} {e}", len(self.etags))

    def row(self, got: Any) -> Any:
        if got is None:
            return None
        entity, etag = got
        tag = self.etag(etag, entity["RowKey"]) if "RowKey" in entity else bool(etag)
        return ({k: _value(v) for k, v in sorted(entity.items())}, tag)

    def add(self, label: str, fn: Callable[[], Any]) -> None:
        try:
            self.seen.append((label, fn()))
        except Conflict as exc:
            self.seen.append((label, "Conflict", exc.index, exc.status))
        except ResourceExistsError:
            self.seen.append((label, "ResourceExists"))


def _e(row: str, **props: Any) -> Dict[str, Any]:
    return {"PartitionKey": "p", "RowKey": row, **props}


def scenario(connection: str, transport: CountingTransport) -> List[Any]:
    tables, queues = storage_clients({"ApprovalStorage": connection}, transport=transport)
    log, o = TableLog(tables, "par"), Observer()
    log.ensure_tables()
    o.add("ensure again", lambda: TableLog(tables, "par").ensure_tables())
    o.add("create existing", lambda: tables.create_table("parState"))
    head = {"PartitionKey": "p", "RowKey": "head", "Seq": 1, "Note": "it's", "When": T,
            "Big": EntityProperty(2 ** 40, EdmType.INT64), "Ratio": 0.5, "Flag": True}
    o.add("insert", lambda: [o.etag(e) for e in log.transact("State", [Op("insert", head)])])
    e1 = log.get("State", "p", "head")[1]  # type: ignore[index]
    o.add("get", lambda: o.row(log.get("State", "p", "head")))
    o.add("get absent", lambda: o.row(log.get("State", "p", "nope")))
    o.add("insert twice", lambda: log.transact("State", [Op("insert", head)]))
    stale = 'W/"datetime\'2020-01-01T00%3A00%3A00.0000000Z\'"'
    o.add("stale merge after upsert", lambda: log.transact("State", [
        Op("upsert", _e("a1")), Op("merge", _e("head", Seq=9), stale)]))
    o.add("nothing of it written", lambda: (o.row(log.get("State", "p", "a1")),
                                            o.row(log.get("State", "p", "head"))))
    o.add("merge", lambda: [o.etag(e) for e in log.transact("State", [Op("merge", _e("head", Seq=2), e1)])])
    o.add("merged", lambda: o.row(log.get("State", "p", "head")))
    o.add("old etag now stale", lambda: log.transact("State", [Op("replace", _e("head", Seq=3), e1)]))
    e2 = log.get("State", "p", "head")[1]  # type: ignore[index]
    o.add("replace", lambda: log.transact("State", [Op("replace", _e("head", Seq=3), e2)]) and None)
    o.add("replaced", lambda: o.row(log.get("State", "p", "head")))
    o.add("merge absent", lambda: log.transact("State", [Op("merge", _e("zz"), e2)]))
    o.add("delete stale", lambda: log.transact("State", [Op("delete", _e("head"), e2)]))
    e3 = log.get("State", "p", "head")[1]  # type: ignore[index]
    o.add("delete", lambda: log.transact("State", [Op("delete", _e("head"), e3)]))
    o.add("deleted", lambda: o.row(log.get("State", "p", "head")))
    o.add("sdk transaction conflict", lambda: log._sdk_transact(log.client("State"), [
        Op("upsert", _e("b1")), Op("insert", _e("b1x")), Op("merge", _e("gone"), stale)]))
    # the rows central queries, and its filters (fleet_state)
    rows = [_e(f"v:{i:03d}", Kind="vm", VmName=f"n{i % 7}", VmId=f"{i:03d}") for i in range(30)]
    rows += [_e(f"o:{i}", Kind="event", Seq=i) for i in range(5)]
    rows += [_e(f"a:{i}", Kind="alert", NextTry=T + timedelta(minutes=i)) for i in range(4)]
    rows += [_e("head", Seq=7), {"PartitionKey": "q", "RowKey": "o:1", "Kind": "vm"}]
    for chunk in (rows[:30], rows[30:]):
        by_pk: Dict[str, List[Op]] = {}
        for r in chunk:
            by_pk.setdefault(r["PartitionKey"], []).append(Op("upsert", r))
        for ops in by_pk.values():
            log.transact("State", ops)
    queries = [
        ("PartitionKey eq @p and ( RowKey eq @head or ( RowKey ge @lo and RowKey lt @hi ) )",
         {"p": "p", "head": "head", "lo": "o:", "hi": "o;"}, None),
        ("PartitionKey eq @p and ( RowKey eq @k0 or RowKey eq @k1 or RowKey eq @k2 )",
         {"p": "p", "k0": "v:003", "k1": "v:999", "k2": "o:2"}, None),
        ("PartitionKey eq @p and Kind eq 'vm' and ( VmName eq @n0 or VmName eq @n1 )",
         {"p": "p", "n0": "n1", "n1": "n3"}, None),
        ("PartitionKey eq @p and Kind eq 'vm'", {"p": "p"}, ["VmId"]),
        ("PartitionKey eq @p and RowKey ge @lo and RowKey lt @hi and NextTry le @now",
         {"p": "p", "lo": "a:", "hi": "a;", "now": T + timedelta(minutes=2)}, None),
        ("Kind eq 'event' and Seq ge @s", {"s": 3}, None),
        ("Seq eq '3'", {}, None),  # a string literal never equals an Int32 property
        ("not ( Kind eq 'vm' ) and PartitionKey eq 'p'", {}, ["RowKey"]),
    ]
    for filter_, params, select in queries:
        o.add(filter_, lambda f=filter_, p=params, s=select: [
            o.row(r) for r in log.query_with_etags("State", f, p, select=s)])
    # log tables: staged upserts, flushed; paging past 1,000 rows
    for i in range(1100):
        log.stage("Decisions", {"PartitionKey": f"d{i // 600}", "RowKey": f"{i:05d}", "N": i})
    o.add("flush", log.flush)
    wanted = [f"{i:05d}" for i in range(1100)]
    o.add("all rows", lambda: [r["RowKey"] for r in log.all_rows("Decisions")] == wanted)
    sender, until = ApprovalSender(queues), T + timedelta(minutes=5)
    o.add("approval to a new queue", lambda: sender.send({"vmId": "vm-1", "eventId": "E1"}, T, until))
    o.add("approval again", lambda: sender.send({"vmId": "vm-1", "eventId": "E2"}, T, until))
    return o.seen


@pytest.fixture(scope="module")
def on_azurite(azurite: processes.Server) -> List[Any]:
    return scenario(azurite.extra["connection_string"], CountingTransport())


@pytest.fixture
def memory_http() -> Iterator[str]:
    servers, connection = net.serve(MemoryStorage())
    yield connection
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("session", [net.session, net.direct_session], ids=["requests", "direct"])
def test_the_stand_in_answers_as_azurite_in_process(on_azurite: List[Any], session: Any) -> None:
    storage = MemoryStorage()
    seen = scenario(net.connection_string(), CountingTransport(session=session(storage)))
    for theirs, ours in zip(on_azurite, seen):
        assert ours == theirs
    assert len(seen) == len(on_azurite)
    assert list(storage.queues.values()) == [2]  # the approval queue was created, and holds two messages


def test_the_stand_in_answers_as_azurite_over_http(on_azurite: List[Any], memory_http: str) -> None:
    assert scenario(memory_http, CountingTransport()) == on_azurite


def test_the_scenario_sees_what_central_relies_on(on_azurite: List[Any]) -> None:
    """The reference itself: conflicts, atomicity and filters as central expects (so agreeing with
    it means something)."""
    seen = dict((s[0], s[1:]) for s in on_azurite)
    assert seen["insert twice"] == ("Conflict", 0, 409)
    assert seen["stale merge after upsert"] == ("Conflict", 1, 412)
    assert seen["nothing of it written"][0][0] is None
    assert seen["old etag now stale"] == ("Conflict", 0, 412)
    assert seen["merge absent"] == ("Conflict", 0, 404)
    assert seen["delete stale"] == ("Conflict", 0, 412)
    assert seen["deleted"] == (None,)
    merged = seen["merged"][0][0]
    assert merged["Seq"] == 2 and merged["Note"] == "it's"
    assert "Note" not in seen["replaced"][0][0]
    assert seen["sdk transaction conflict"] == ("Conflict", 2, 404)  # the row it names is absent
    vms = seen["PartitionKey eq @p and Kind eq 'vm' and ( VmName eq @n0 or VmName eq @n1 )"][0]
    assert sorted(r[0]["VmName"] for r in vms) == ["n1"] * 5 + ["n3"] * 4
    assert seen["Seq eq '3'"] == ([],)
    assert seen["all rows"] == (True,)


@pytest.mark.parametrize("text,entity,expected", [
    ("A eq 1", {"A": 1}, True),
    ("A eq '1'", {"A": 1}, False),
    ("A ne 'x'", {}, False),
    ("A lt 5L", {"A": "4", "A@odata.type": "Edm.Int64"}, True),
    ("not ( A eq 'x' )", {"A": "y"}, True),
    ("D ge datetime'2026-01-01T00:00:00Z'",
     {"D": "2026-01-01T00:00:00.0000001Z", "D@odata.type": "Edm.DateTime"}, True),
    ("N eq 'it''s' or B eq true", {"N": "it's"}, True),
])
def test_filter_rules(text: str, entity: Dict[str, Any], expected: bool) -> None:
    assert odata.matches(odata.parse(text), entity) is expected


def test_a_filter_outside_the_subset_is_refused() -> None:
    with pytest.raises(odata.FilterError):
        odata.parse("startswith(A, 'x')")
