"""The log store on Azurite: one transaction per partition chunk, one HTTP request each, nothing lost."""

from __future__ import annotations

import uuid

import pytest
from azure.data.tables import TableServiceClient

from central.settings import CountingTransport
from central.store import StoreError, TableLog
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
    log.stage("Vms", {"PartitionKey": "vm", "RowKey": "a", "Seen": 1})
    assert log.flush() == 3  # 100 + 50 rows, and one Vms row
    assert transport.requests - before == 3
    rows = list(log.service.get_table_client(log.name("Incarnations")).list_entities())
    assert len(rows) == 150
    first = next(r for r in rows if r["RowKey"] == "r000")
    assert first["Extra"] is True and first["N"] == 0 and first["Name"] == "o'brien"


def test_a_refused_write_keeps_the_rows_and_says_why(azurite: processes.Server) -> None:
    log = log_for(azurite)
    log.stage("Events", {"PartitionKey": "2026-11", "RowKey": "ok", "A": 1})
    log.stage(
        "Events", {"PartitionKey": "2026-11", "RowKey": "bad", "Huge": "x" * 70_000}
    )  # > 64 KiB property
    with pytest.raises(StoreError, match="rows kept"):
        log.flush()
    assert log.staged_count == 2
    log.stage("Events", {"PartitionKey": "2026-11", "RowKey": "bad", "Huge": "fixed"})
    assert log.flush() == 1 and log.staged_count == 0
    assert len(list(log.service.get_table_client(log.name("Events")).list_entities())) == 2


def test_claims_are_exactly_once(azurite: processes.Server) -> None:
    log = log_for(azurite)
    assert log.claim("E1:approval:1", "c00") is True
    assert log.claim("E1:approval:1", "c00") is False
    assert log.claim("E1:approval:2", "c00") is True


def test_claim_many_in_one_transaction_or_one_by_one(azurite: processes.Server) -> None:
    log = log_for(azurite)
    assert log.claim_many(["k1", "k2", "k3"], "alerts") == {"k1", "k2", "k3"}
    assert log.claim_many(["k3", "k4"], "alerts") == {"k4"}  # k3 was taken: the transaction fails whole
    assert log.claim_many([], "alerts") == set()


def test_the_wire_transaction_stores_what_submit_transaction_stores(azurite: processes.Server) -> None:
    """central/batch_wire.py is a hand-written fast path beside the SDK's submit_transaction: the same
    entities written both ways must read back identical, whatever the keys and value types."""
    from datetime import datetime, timezone

    from azure.data.tables import UpdateMode

    from central import batch_wire

    log = log_for(azurite)
    keys = ["plain", "o'brien", "with space", "per%cent", "plus+sign", "ünïcødé-名前", "semi;colon", "a&b=c"]
    when = datetime(2026, 11, 21, 4, 32, 1, 123000, tzinfo=timezone.utc)

    def entities(partition: str) -> list:
        return [{"PartitionKey": partition, "RowKey": key, "Text": f"value {key} \"quoted\" \n newline",
                 "Int": 2**30, "Small": -3, "Float": 1.5, "Bool": False, "When": when, "Empty": ""}
                for key in keys]

    client = log.service.get_table_client(log.name("Events"))
    batch_wire.upsert_merge(client, entities("wire"))
    client.submit_transaction([("upsert", e, {"mode": UpdateMode.MERGE}) for e in entities("sdk")])

    def read(partition: str) -> dict:
        rows = client.query_entities("PartitionKey eq @p", parameters={"p": partition})
        return {r["RowKey"]: {k: v for k, v in r.items() if k != "PartitionKey"} for r in rows}

    wire, sdk = read("wire"), read("sdk")
    assert sorted(wire) == sorted(keys)
    assert wire == sdk
