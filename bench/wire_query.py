"""CPU of one State query, the SDK's query_entities against central.store.batch_wire.query (issue 24).

    python -m bench.wire_query

Both send the same request through the same TableClient to the in-memory stand-in (bench.table_memory,
over the SDK's own transport), and both give the same entities (checked here; tests/central/test_store.py
checks it on Azurite). Measured: client CPU per query, the stand-in's answering excluded, for the two
shapes central reads: 14 keys (an event or VM read by key) and 2,000 rows in two pages (every active
event). Median [min-max] of 3 runs, and the ratio wire / SDK of the medians.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from statistics import median
from typing import Any, Callable, Dict, List, Tuple

from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import EdmType, TableServiceClient

from bench import Figure, record, spread_figure, table_memory_net
from bench.table_memory import MemoryStorage
from central.store import batch_wire

REPEATS_INSIDE = True
RUNS = 3
ROWS = 2_000


def _client(storage: MemoryStorage) -> Any:
    transport = RequestsTransport(session=table_memory_net.session(storage))
    service = TableServiceClient.from_connection_string(table_memory_net.connection_string(),
                                                        transport=transport)
    service.create_table_if_not_exists("Query")
    client = service.get_table_client("Query")
    when = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
    json = '{"approvals": [1, 2, 3], "state": "x"}' * 20  # an event row's size
    rows = [{"PartitionKey": "p", "RowKey": f"o:{i:05d}", "Json": json, "Seq": i,
             "Big": (2**40 + i, EdmType.INT64), "At": when, "Flag": True} for i in range(ROWS)]
    for i in range(0, ROWS, 100):
        batch_wire.transact(client, [("insert", row, None) for row in rows[i : i + 100]])
    return client


def main() -> None:
    storage = MemoryStorage()
    client = _client(storage)
    keys: Dict[str, Any] = {f"k{i}": f"o:{i * 7:05d}" for i in range(14)}
    keys["p"] = "p"
    by_key = "PartitionKey eq @p and ( " + " or ".join(f"RowKey eq @k{i}" for i in range(14)) + " )"
    every = ("PartitionKey eq @p and RowKey ge @lo", {"p": "p", "lo": "o:"})

    def sdk(filter_: str, parameters: Dict[str, Any]) -> List[Tuple[dict, dict]]:
        found = client.query_entities(filter_, parameters=parameters, results_per_page=1000)
        return [(dict(e), e.metadata) for e in found]

    def wire(filter_: str, parameters: Dict[str, Any]) -> List[Tuple[dict, dict]]:
        return [(dict(e), e.metadata) for e in batch_wire.query(client, filter_, parameters)]

    assert wire(by_key, keys) == sdk(by_key, keys) and len(wire(by_key, keys)) == 14
    assert wire(*every) == sdk(*every) and len(wire(*every)) == ROWS
    figures = []
    for shape, args, count in (("14 keys", (by_key, keys), 300), (f"{ROWS:,} rows", every, 5)):
        ms: Dict[str, List[float]] = {"SDK": [], "wire": []}
        for _ in range(RUNS):
            for how, fn in (("SDK", sdk), ("wire", wire)):
                ms[how].append(_cpu_ms(storage, lambda f=fn, a=args: f(*a), count))  # type: ignore[misc]
        ratio = median(ms["wire"]) / median(ms["SDK"])
        print(f"{shape}: SDK {median(ms['SDK']):.2f} ms [{min(ms['SDK']):.2f}-{max(ms['SDK']):.2f}], wire "
              f"{median(ms['wire']):.2f} ms [{min(ms['wire']):.2f}-{max(ms['wire']):.2f}] CPU per query; "
              f"wire / SDK x{ratio:.2f}")
        for how in ms:
            figures.append(spread_figure(Figure("wire_query", f"{how} query CPU, {shape}", 0, "ms"), ms[how]))
        figures.append(Figure("wire_query", f"wire / SDK query CPU, {shape}", round(ratio, 2), "x",
                              goal="< 1", met=ratio < 1))
    record(figures)


def _cpu_ms(storage: MemoryStorage, query: Callable[[], object], count: int) -> float:
    """Client CPU per query in ms: process CPU less the stand-in's answering."""
    cpu, answering = time.process_time(), storage.cpu
    for _ in range(count):
        query()
    return ((time.process_time() - cpu) - (storage.cpu - answering)) / count * 1000


if __name__ == "__main__":
    main()
