"""Table storage through azure-data-tables: the State table's transactions and the log tables' writes.

Two kinds of writes. The State table (the fleet's shared truth, central.store.fleet_state) is changed only by
`transact`: conditional operations (If-Match ETags, insert-if-absent) in one entity-group transaction,
all or nothing; a lost race raises `Conflict` and the caller re-reads and decides again. The log tables
(Incarnations, Decisions, Alerts, Quarantine: append-mostly history with deterministic keys) are staged
during a call and flushed once, one upsert transaction per (table, partition) chunk. A log row the
service refuses for its content (HTTP 400) is set aside and reported, never retried forever; a row
that failed for a transient reason stays staged for the next flush. Table layout: docs/central.md.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableServiceClient, TableTransactionError, UpdateMode

from central.store import batch_wire

log = logging.getLogger("central.store")  # stable: docs and queries select on it

TABLES = ("State", "Incarnations", "Decisions", "Alerts", "Quarantine")
MAX_OPS = 100  # Table storage: at most 100 operations per transaction
MAX_TXN_BYTES = 3 * 1024 * 1024  # payload limit is 4 MiB; keep a margin for the multipart framing
PART_CHARS = 15_000  # 64 KiB per string property = 32K UTF-16 units; 15K chars is safe for any text
MAX_JSON_BYTES = 600_000  # per JSON column (UTF-16 bytes), so the entity stays under 1 MiB


class StoreError(RuntimeError):
    """Table storage could not be reached or written for a transient reason (the call may be retried)."""


class Conflict(Exception):
    """A transaction lost a race: operation `index` found the row changed (412), present (409) or gone
    (404). Nothing of the transaction was written; re-read and decide again."""

    def __init__(self, index: int, status: int, message: str = "") -> None:
        super().__init__(f"operation {index}: HTTP {status} {message}"[:300])
        self.index = index
        self.status = status


class Rejected(Exception):
    """The service refused operation `index` for its content (HTTP 400): retrying cannot help."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message[:500])
        self.index = index


@dataclass(frozen=True)
class Op:
    """One operation of a State transaction: kind upsert | merge | replace | insert | delete."""

    kind: str
    entity: Dict[str, Any]
    etag: Optional[str] = None


def put_json(entity: Dict[str, Any], name: str, value: Any) -> None:
    """Store `value` as JSON in column `name`, split over name, name_1, name_2... when it is large;
    cut (with nameTruncated=True and nameLength) when it would pass the entity size limit."""
    # empty containers are most of an event row's JSON columns: no encoder for them (same text)
    text = ("{}" if type(value) is dict else "[]") if type(value) in (dict, list) and not value else \
        json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    length = len(text)
    truncated = False
    # UTF-16 takes at most 4 bytes a character: only a text that long can pass the limit (encode it then)
    if length * 4 > MAX_JSON_BYTES and len(text.encode("utf-16-le", "surrogatepass")) > MAX_JSON_BYTES:
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
    text = entity[name]
    if text == "[]" or text == "{}":  # most of an event row's JSON columns (put_json's own fast path)
        return [] if text == "[]" else {}
    text += "".join(
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
    rejected: List[str] = field(default_factory=list)  # log rows set aside since the last take_rejected()
    _clients: Dict[str, Any] = field(default_factory=dict)  # a TableClient per table (each builds a pipeline)

    def name(self, table: str) -> str:
        return f"{self.prefix}{table}"

    def ensure_tables(self) -> None:
        """Create the tables once per instance (tolerating ResourceExists)."""
        if self._ready:
            return
        try:  # one list instead of five creates on every instance's start (they exist after the first)
            names = {self.name(t) for t in TABLES}
            existing = {t.name for t in self.service.query_tables(f"TableName ge '{min(names)}'")}
        except AzureError:
            existing = set()
        for table in TABLES:
            if self.name(table) in existing:
                continue
            try:
                self.service.create_table(self.name(table))
            except ResourceExistsError:
                pass
            except AzureError as exc:
                raise StoreError(f"table {self.name(table)} cannot be created: {exc}"[:500]) from exc
        self._ready = True

    def client(self, table: str) -> Any:
        found = self._clients.get(table)
        if found is None:
            found = self._clients[table] = self.service.get_table_client(self.name(table))
        return found

    # ---- State: conditional transactions --------------------------------------------------------
    def transact(self, table: str, ops: Sequence[Op]) -> List[Optional[str]]:
        """Run `ops` (one partition, <= 100) all or nothing; returns each operation's new ETag.
        Raises Conflict (a lost race), Rejected (content refused) or StoreError (transient)."""
        self.ensure_tables()
        client = self.client(table)
        wire = [(op.kind, op.entity, op.etag) for op in ops]
        try:
            return batch_wire.transact(client, wire)
        except batch_wire.WireBatchError as exc:
            if exc.status in (404, 409, 412):
                raise Conflict(max(exc.index, 0), exc.status, exc.code) from None
            if exc.status == 400 or exc.status == 413:
                raise Rejected(max(exc.index, 0), str(exc)) from None
            if exc.status and exc.status >= 500:
                raise StoreError(f"{self.name(table)}: {exc}"[:500]) from None
            log.info("wire transaction unreadable (%s); retrying through submit_transaction", exc)
        except (TypeError, ValueError) as exc:  # a value the SDK's serialiser refuses
            raise Rejected(0, f"{type(exc).__name__}: {exc}") from None
        except AzureError as exc:
            raise StoreError(f"{self.name(table)}: {exc}"[:500]) from exc
        return self._sdk_transact(client, ops)

    @staticmethod
    def _sdk_transact(client: Any, ops: Sequence[Op]) -> List[Optional[str]]:
        """The SDK's own transaction (the reference the wire path is tested against; its fallback)."""
        sdk: List[Any] = []
        for op in ops:
            cond = {"etag": op.etag, "match_condition": MatchConditions.IfNotModified} if op.etag else {}
            if op.kind == "upsert":
                sdk.append(("upsert", op.entity, {"mode": UpdateMode.MERGE}))
            elif op.kind in ("merge", "replace"):
                mode = UpdateMode.MERGE if op.kind == "merge" else UpdateMode.REPLACE
                sdk.append(("update", op.entity, {"mode": mode, **cond}))
            elif op.kind == "insert":
                sdk.append(("create", op.entity))
            else:
                sdk.append(("delete", op.entity, cond))
        try:
            results = client.submit_transaction(sdk)
        except TableTransactionError as exc:
            if exc.status_code in (404, 409, 412):
                raise Conflict(exc.index, exc.status_code or 0) from None
            if exc.status_code in (400, 413):
                raise Rejected(exc.index, str(exc)) from None
            raise StoreError(str(exc)[:500]) from exc
        except AzureError as exc:
            raise StoreError(str(exc)[:500]) from exc
        return [r.get("etag") for r in results]

    def get(self, table: str, partition: str, row: str) -> Optional[Tuple[Dict[str, Any], str]]:
        """(entity, etag) or None when absent."""
        self.ensure_tables()
        try:
            e = self.client(table).get_entity(partition, row)
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise StoreError(f"{self.name(table)} read failed: {exc}"[:500]) from exc
        return dict(e), e.metadata["etag"]

    def query_with_etags(self, table: str, filter_: str, parameters: Optional[Dict[str, Any]] = None,
                         select: Optional[List[str]] = None) -> List[Tuple[Dict[str, Any], str]]:
        self.ensure_tables()
        try:
            found = batch_wire.query(self.client(table), filter_, parameters or {}, select, timestamps=False)
            return [(dict(e), e.metadata.get("etag", "")) for e in found]
        except AzureError as exc:
            raise StoreError(f"{self.name(table)} query failed: {exc}"[:500]) from exc

    def query(
        self, table: str, filter_: str, parameters: Optional[Dict[str, Any]] = None
    ) -> List[Dict[str, Any]]:
        return [e for e, _ in self.query_with_etags(table, filter_, parameters)]

    def all_rows(self, table: str) -> List[Dict[str, Any]]:
        self.ensure_tables()
        return [dict(e) for e in self.client(table).list_entities(results_per_page=1000)]

    # ---- log tables: staged upserts ------------------------------------------------------------
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

    def take_rejected(self) -> List[str]:
        out, self.rejected = self.rejected, []
        return out

    def flush(self) -> int:
        """Write everything staged: one transaction per (table, partition) chunk. Returns the number
        of transactions. A row refused for its content is set aside (see `rejected`); on a transient
        failure the unwritten rows stay staged and StoreError is raised."""
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
                    sent += self._write_chunk(table, chunk)
                except StoreError as exc:
                    failures.append(str(exc))
        if failures:
            raise StoreError(
                "log store write failed (rows kept, retried at the next flush): " + "; ".join(failures)
            )
        return sent

    def _write_chunk(self, table: str, chunk: List[Tuple[Tuple[str, str, str], Dict[str, Any]]]) -> int:
        try:
            self.transact(table, [Op("upsert", e) for _, e in chunk])
        except Rejected as exc:
            if len(chunk) == 1:  # this very row: set it aside, never retried
                key = chunk[0][0]
                self._staged.pop(key, None)
                self.rejected.append(f"{self.name(table)} {key[1]}/{key[2][:80]}: {exc}"[:500])
                log.error("log row set aside (the store refuses it): %s", self.rejected[-1])
                return 0
            half = len(chunk) // 2  # find the refused row(s): the others still go in
            return self._write_chunk(table, chunk[:half]) + self._write_chunk(table, chunk[half:])
        except Conflict as exc:  # an upsert cannot conflict; treat as transient
            raise StoreError(f"{self.name(table)}: {exc}") from None
        for key, _ in chunk:
            self._staged.pop(key, None)
        return 1

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


_FORBIDDEN = str.maketrans({c: "_" for c in "/\\#?\t\n\r"})


def safe_key(text: str) -> str:
    """A PartitionKey/RowKey-safe form of `text` (Table keys forbid / \\ # ? and control characters)."""
    return text.translate(_FORBIDDEN)[:512]
