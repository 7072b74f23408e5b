"""The log store: Azure Table storage through azure-data-tables.

Writes are staged during a batch and flushed as one transaction per (table, partition) (at most 100
operations and ~3 MB each). Partition keys are chosen so a typical batch touches few partitions:
Incarnations by UTC day of the envelope's own time (a replay lands on the same row), Vms in one
partition, Events by month of first sight. Reads happen once per instance (load_* at start-up);
later decisions use the in-memory registry. Claims (create-only rows) make approvals and alerts
exactly-once across Function instances. Table layout: docs/central.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableServiceClient, TableTransactionError, UpdateMode

from . import batch_wire

log = logging.getLogger(__name__)

TABLES = ("Incarnations", "Events", "Decisions", "Vms", "Alerts", "Quarantine", "Claims")
MAX_OPS = 100  # Table storage: at most 100 operations per transaction
MAX_TXN_BYTES = 3 * 1024 * 1024  # payload limit is 4 MiB; keep a margin for the multipart framing
PART_CHARS = 15_000  # 64 KiB per string property = 32K UTF-16 units; 15K chars is safe for any text
MAX_JSON_BYTES = 600_000  # per JSON column (UTF-16 bytes), so the entity stays under 1 MiB


class StoreError(RuntimeError):
    """The log store could not be written; the staged rows are kept and retried at the next flush."""


def put_json(entity: Dict[str, Any], name: str, value: Any) -> None:
    """Store `value` as JSON in column `name`, split over name, name_1, name_2... when it is large;
    cut (with nameTruncated=True and nameLength) when it would pass the entity size limit."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    length = len(text)
    truncated = False
    if len(text.encode("utf-16-le", "surrogatepass")) > MAX_JSON_BYTES:
        text = text[: MAX_JSON_BYTES // 4]
        truncated = True
    parts = [text[i : i + PART_CHARS] for i in range(0, len(text), PART_CHARS)] or [""]
    entity[name] = parts[0]
    for i, part in enumerate(parts[1:], start=1):
        entity[f"{name}_{i}"] = part
    if len(parts) > 1:
        entity[f"{name}Parts"] = len(parts)
    if truncated:
        entity[f"{name}Truncated"] = True
        entity[f"{name}Length"] = length


def get_json(entity: Dict[str, Any], name: str, default: Any = None) -> Any:
    """Read a column written by put_json (None/default when absent or truncated)."""
    if name not in entity or entity.get(f"{name}Truncated"):
        return default
    text = entity[name] + "".join(
        entity.get(f"{name}_{i}", "") for i in range(1, int(entity.get(f"{name}Parts", 1)))
    )
    try:
        return json.loads(text)
    except ValueError:
        return default


def _size(entity: Dict[str, Any]) -> int:
    return len(json.dumps(entity, default=str)) + 200


@dataclass
class TableLog:
    service: TableServiceClient
    prefix: str = ""
    _staged: Dict[Tuple[str, str, str], Dict[str, Any]] = field(default_factory=dict)
    _ready: bool = False

    def name(self, table: str) -> str:
        return f"{self.prefix}{table}"

    def ensure_tables(self) -> None:
        """Create the tables once per instance (tolerating ResourceExists)."""
        if self._ready:
            return
        for table in TABLES:
            try:
                self.service.create_table(self.name(table))
            except ResourceExistsError:
                pass
        self._ready = True

    # ---- writes --------------------------------------------------------------------------------
    def stage(self, table: str, entity: Dict[str, Any]) -> None:
        """Upsert (merge) `entity` at the next flush; a second stage of the same row merges into it,
        since a transaction may not touch one entity twice."""
        key = (table, entity["PartitionKey"], entity["RowKey"])
        if key in self._staged:
            self._staged[key].update(entity)
        else:
            self._staged[key] = dict(entity)

    @property
    def staged_count(self) -> int:
        return len(self._staged)

    def flush(self) -> int:
        """Write everything staged: one transaction per (table, partition) chunk. Returns the number
        of transactions. On failure the unwritten rows stay staged and StoreError is raised."""
        if not self._staged:
            return 0
        self.ensure_tables()
        groups: Dict[Tuple[str, str], List[Tuple[Tuple[str, str, str], Dict[str, Any]]]] = {}
        for key, entity in self._staged.items():
            groups.setdefault((key[0], key[1]), []).append((key, entity))
        sent = 0
        failures: List[str] = []
        for (table, _pk), rows in groups.items():
            for chunk in self._chunks(rows):
                try:
                    self._submit(table, [e for _, e in chunk])
                except (AzureError, ValueError) as exc:
                    failures.append(f"{self.name(table)}: {exc}"[:500])
                    continue
                sent += 1
                for key, _ in chunk:
                    self._staged.pop(key, None)
        if failures:
            raise StoreError(
                "log store write failed (rows kept, retried at the next flush): " + "; ".join(failures)
            )
        return sent

    @staticmethod
    def _chunks(rows: List[Any]) -> Iterable[List[Any]]:
        chunk: List[Any] = []
        size = 0
        for row in rows:
            row_size = _size(row[1])
            if chunk and (len(chunk) >= MAX_OPS or size + row_size > MAX_TXN_BYTES):
                yield chunk
                chunk, size = [], 0
            chunk.append(row)
            size += row_size
        if chunk:
            yield chunk

    def _submit(self, table: str, entities: List[Dict[str, Any]]) -> None:
        client = self.service.get_table_client(self.name(table))
        if len(entities) == 1:
            client.upsert_entity(entities[0], mode=UpdateMode.MERGE)
            return
        try:
            batch_wire.upsert_merge(client, entities)
            return
        except (batch_wire.WireBatchError, AzureError, AttributeError, TypeError) as exc:
            log.info("wire transaction failed (%s); retrying through submit_transaction", exc)
        client.submit_transaction([("upsert", e, {"mode": UpdateMode.MERGE}) for e in entities])

    # ---- claims: create-only rows, so two instances never both send one approval or alert -------
    def claim(self, key: str, partition: str, **columns: Any) -> bool:
        """True when this instance is the first to claim `key` (the row did not exist)."""
        self.ensure_tables()
        entity = {"PartitionKey": partition, "RowKey": safe_key(key), **columns}
        try:
            self.service.get_table_client(self.name("Claims")).create_entity(entity)
        except ResourceExistsError:
            return False
        except AzureError as exc:
            raise StoreError(f"claim {key!r} failed: {exc}") from exc
        return True

    def claim_many(self, keys: List[str], partition: str, **columns: Any) -> Set[str]:
        """Claim several keys of one partition: one transaction when none was claimed before (the
        common case), else one request per key. Returns the keys this instance now holds."""
        if not keys:
            return set()
        if len(keys) > 1 and len(keys) <= MAX_OPS:
            self.ensure_tables()
            ops = [("create", {"PartitionKey": partition, "RowKey": safe_key(k), **columns}) for k in keys]
            try:
                self.service.get_table_client(self.name("Claims")).submit_transaction(ops)
                return set(keys)
            except TableTransactionError:
                pass  # some key was claimed already: sort them out one by one
            except AzureError as exc:
                raise StoreError(f"claims failed: {exc}") from exc
        return {k for k in keys if self.claim(k, partition, **columns)}

    def read_claim(self, key: str, partition: str) -> Optional[Dict[str, Any]]:
        """The claim row (who claimed, what they sent), or None if it is gone."""
        try:
            return dict(
                self.service.get_table_client(self.name("Claims")).get_entity(partition, safe_key(key))
            )
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise StoreError(f"claim {key!r} unreadable: {exc}") from exc

    def mark_claim(self, key: str, partition: str, **columns: Any) -> None:
        """Add columns to a claim row (e.g. Sent once the guarded action happened). Best effort: an
        unmarked claim is re-done by whoever adopts it, and every such action is idempotent."""
        entity = {"PartitionKey": partition, "RowKey": safe_key(key), **columns}
        try:
            self.service.get_table_client(self.name("Claims")).update_entity(entity, mode=UpdateMode.MERGE)
        except AzureError as exc:
            log.warning("claim %r not marked: %s", key, exc)

    def release(self, key: str, partition: str) -> None:
        """Give a claim back (the action it guarded did not happen). Best effort."""
        try:
            self.service.get_table_client(self.name("Claims")).delete_entity(partition, safe_key(key))
        except AzureError as exc:
            log.warning("claim %r not released: %s", key, exc)

    # ---- reads (once per instance) -------------------------------------------------------------
    def query(
        self, table: str, filter_: str, parameters: Optional[Dict[str, Any]] = None
    ) -> List[Dict[str, Any]]:
        self.ensure_tables()
        client = self.service.get_table_client(self.name(table))
        return [
            dict(e)
            for e in client.query_entities(filter_, parameters=parameters or {}, results_per_page=1000)
        ]

    def all_rows(self, table: str) -> List[Dict[str, Any]]:
        self.ensure_tables()
        return [
            dict(e)
            for e in self.service.get_table_client(self.name(table)).list_entities(results_per_page=1000)
        ]


_FORBIDDEN = str.maketrans({c: "_" for c in "/\\#?\t\n\r"})


def safe_key(text: str) -> str:
    """A PartitionKey/RowKey-safe form of `text` (Table keys forbid / \\ # ? and control characters)."""
    return text.translate(_FORBIDDEN)[:512]
