"""An in-memory Table (and approval Queue) service that the real azure SDKs talk to, for bench.wave_sim.

Azurite on this 2-core machine decides ~900 of a 100k-VM wave's 10,000 events in the time a benchmark
may take; this answers the same REST subset in memory. bench.table_memory_net connects it where the network
would be: a `requests` transport adapter on azure-core's RequestsTransport (so azure-data-tables,
azure-storage-queue, central.store.tables and batch_wire run unchanged: the SDK's serialisation,
policies, retries and error mapping; only the socket, and in the simulation requests' per-request
preparation, are skipped), or a loopback HTTP server.

The subset central uses, with the service's answers (checked against Azurite by
tests/bench/test_table_memory.py, which runs the same operations against both):
- tables: list (`$filter` on TableName), create (409 TableAlreadyExists);
- entities: get (404 ResourceNotFound), insert (409 EntityAlreadyExists), merge / replace / delete with
  If-Match (412 UpdateConditionNotSatisfied; 404 when absent; `*` = any), upsert (no If-Match);
- queries: `$filter` (bench.odata_filter), `$select`, `$top` with continuation, ordered by keys;
- `$batch`: one changeset on one partition, all or nothing, the failed operation named "N:" as the
  service does; ETags are new on every write;
- queues: create, send a message (404 QueueNotFound when absent), kept as a count per queue.
"""

from __future__ import annotations

import bisect
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

from bench import odata_filter as odata

EPOCH = date(2026, 1, 1)  # ETags and Timestamps count from here (ticks, not the clock: reproducible)
TABLE_PORT, QUEUE_PORT, BLOB_PORT = 1, 2, 3  # the connection string's ports: names, never dialled
_ENTITY_PATH = re.compile(r"^([A-Za-z][A-Za-z0-9]{2,62})\(PartitionKey='(.*)',RowKey='(.*)'\)$", re.DOTALL)
_PART = re.compile(r"^(GET|POST|PUT|PATCH|MERGE|DELETE) (\S+) HTTP/1\.1\n(.*?)(?:\n\n(.*))?$", re.DOTALL)
Answer = Tuple[int, Dict[str, str], bytes]


class Failure(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Partition:
    rows: Dict[str, Tuple[Dict[str, Any], str]] = field(default_factory=dict)  # RowKey -> (entity, etag)
    keys: List[str] = field(default_factory=list)  # sorted RowKeys
    # property -> string value -> RowKeys: built the first time a filter asks for `prop eq '..'`, so
    # a query on a non-key property reads the matching rows, not the whole partition (the service
    # scans; this only keeps the stand-in's CPU out of the simulation's way)
    index: Dict[str, Dict[str, set]] = field(default_factory=dict)
    # RowKey -> the row as a query answers it (JSON), made at its first read after each write: a row is read
    # many times per write in a wave (the stand-in's CPU is the simulation's run time, not Azure's)
    shown: Dict[str, str] = field(default_factory=dict)

    def put(self, row: str, value: Tuple[Dict[str, Any], str]) -> None:
        had = self.rows.get(row)
        self.shown.pop(row, None)
        if had is None:
            bisect.insort(self.keys, row)
        self._unindex(row, had)
        self.rows[row] = value
        for prop, by_value in self.index.items():
            v = value[0].get(prop)
            if isinstance(v, str):
                by_value.setdefault(v, set()).add(row)

    def drop(self, row: str) -> None:
        self.shown.pop(row, None)
        self._unindex(row, self.rows.pop(row))
        self.keys.pop(bisect.bisect_left(self.keys, row))

    def _unindex(self, row: str, had: Optional[Tuple[Dict[str, Any], str]]) -> None:
        if had is None:
            return
        for prop, by_value in self.index.items():
            v = had[0].get(prop)
            if isinstance(v, str):
                by_value.get(v, set()).discard(row)

    def lookup(self, prop: str, values: List[str]) -> List[str]:
        """The RowKeys whose `prop` is one of `values` (sorted)."""
        if prop not in self.index:
            by_value: Dict[str, set] = {}
            for rk, (entity, _) in self.rows.items():
                v = entity.get(prop)
                if isinstance(v, str):
                    by_value.setdefault(v, set()).add(rk)
            self.index[prop] = by_value
        found = self.index[prop]
        return sorted(set().union(*(found.get(v, set()) for v in values)))


@dataclass
class MemoryStorage:
    """The account's state: tables of partitions, queues (message counts). Thread-safe (one lock)."""

    tables: Dict[str, Dict[str, Partition]] = field(default_factory=dict)
    queues: Dict[str, int] = field(default_factory=dict)
    requests: int = 0
    cpu: float = 0.0  # thread CPU seconds spent answering (the stand-in's own share of a run)
    _tick: int = 0
    _journal: Optional[List[Tuple[Partition, str, Optional[Tuple[Dict[str, Any], str]]]]] = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, method: str, url: str, headers: Dict[str, str], body: bytes) -> Answer:
        with self._lock:
            started = time.thread_time()
            try:
                return self._handle(method, url, headers, body)
            finally:
                self.requests += 1
                self.cpu += time.thread_time() - started

    def _handle(self, method: str, url: str, headers: Dict[str, str], body: bytes) -> Answer:
        parts = urlsplit(url)
        path = unquote(parts.path).split("/", 2)[-1] if parts.path.count("/") >= 2 else ""
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        try:
            if parts.port == QUEUE_PORT:
                return self._queue(method, path, query)
            return self._table(method, path, query, headers, body, url)
        except Failure as f:
            return _error(f)

    # ---- tables ---------------------------------------------------------------------------------
    def _table(self, method: str, path: str, query: Dict[str, str], headers: Dict[str, str], body: bytes,
               url: str) -> Answer:
        if path == "$batch" and method == "POST":
            return self._batch(headers, body)
        if path == "Tables":
            if method == "GET":
                node = _filter(query.get("$filter"))
                names = [n for n in sorted(self.tables)
                         if node is None or odata.matches(node, {"TableName": n})]
                return _json(200, {"value": [{"TableName": n} for n in names]})
            name = json.loads(body or b"{}").get("TableName", "")
            if name in self.tables:
                raise Failure(409, "TableAlreadyExists", "The table specified already exists.")
            self.tables[name] = {}
            return _json(201, {"TableName": name})
        found = _ENTITY_PATH.match(path)
        if found:
            table, pk, rk = found.group(1), _key(found.group(2)), _key(found.group(3))
            if method == "GET":
                entity, etag = self._row(table, pk, rk)
                return _json(200, _shown(entity, etag), {"ETag": etag})
            entity = json.loads(body) if body else {}
            etag = self._write(method, table, pk, rk, entity, headers.get("If-Match"))
            return 204, {"ETag": etag} if etag else {}, b""
        table = path[:-2] if path.endswith("()") else path
        if method == "GET":
            return self._query(table, query)
        if method == "POST":
            entity = json.loads(body)
            etag = self._write("POST", table, entity["PartitionKey"], entity["RowKey"], entity, None)
            if "return-no-content" in headers.get("Prefer", ""):
                return 204, {"ETag": etag, "Preference-Applied": "return-no-content"}, b""
            return _json(201, _shown(self._row(table, entity["PartitionKey"], entity["RowKey"])[0], etag),
                         {"ETag": etag})
        raise Failure(400, "InvalidInput", f"{method} {url} is not in the subset this stand-in answers")

    def _partitions(self, table: str) -> Dict[str, Partition]:
        if table not in self.tables:
            raise Failure(404, "TableNotFound", "The table specified does not exist.")
        return self.tables[table]

    def _row(self, table: str, pk: str, rk: str) -> Tuple[Dict[str, Any], str]:
        part = self._partitions(table).get(pk)
        if part is None or rk not in part.rows:
            raise Failure(404, "ResourceNotFound", "The specified resource does not exist.")
        return part.rows[rk]

    def _etag(self) -> Tuple[str, str]:
        self._tick += 1
        micros, tenth = divmod(self._tick, 10)  # formatted by arithmetic, not strftime: once per write
        days, micros = divmod(micros, 86_400_000_000)
        seconds, fraction = divmod(micros, 1_000_000)
        minutes, second = divmod(seconds, 60)
        day = (EPOCH + timedelta(days=days)).isoformat()
        stamp = f"{day}T{minutes // 60:02d}:{minutes % 60:02d}:{second:02d}.{fraction:06d}{tenth}Z"
        return f"W/\"datetime'{stamp.replace(':', '%3A')}'\"", stamp

    def _write(self, method: str, table: str, pk: str, rk: str, body: Dict[str, Any],
               if_match: Optional[str]) -> Optional[str]:
        """One write; raises Failure before changing anything. Returns the new ETag (None: deleted)."""
        part = self._partitions(table).setdefault(pk, Partition())
        have = part.rows.get(rk)
        if method == "POST" and have is not None:
            raise Failure(409, "EntityAlreadyExists", "The specified entity already exists.")
        if if_match is not None and method != "POST":
            if have is None:
                raise Failure(404, "ResourceNotFound", "The specified resource does not exist.")
            if if_match != "*" and if_match != have[1]:
                raise Failure(412, "UpdateConditionNotSatisfied",
                              "The update condition specified in the request was not satisfied.")
        if method == "DELETE" and have is None:
            raise Failure(404, "ResourceNotFound", "The specified resource does not exist.")
        if self._journal is not None:
            self._journal.append((part, rk, have))
        if method == "DELETE":
            part.drop(rk)
            return None
        props = {k: v for k, v in body.items()
                 if not k.startswith("odata.") and not (k.endswith("@odata.type") and v == "Edm.String")}
        props.pop("Timestamp", None)
        props.pop("Timestamp@odata.type", None)
        if method in ("PATCH", "MERGE") and have is not None:
            props = {**have[0], **props}
        etag, stamp = self._etag()
        props.update(PartitionKey=pk, RowKey=rk, Timestamp=stamp)
        part.put(rk, (props, etag))
        return etag

    def _query(self, table: str, query: Dict[str, str]) -> Answer:
        partitions = self._partitions(table)
        node = _filter(query.get("$filter"))
        top = min(int(query.get("$top") or 1000), 1000)
        after = (query.get("NextPartitionKey", ""), query.get("NextRowKey", ""))
        pk_ranges = odata.key_ranges(node, "PartitionKey")
        rk_ranges = odata.key_ranges(node, "RowKey")
        out: List[Tuple[Partition, str]] = []
        more: Optional[Tuple[str, str]] = None
        for pk in _in_ranges(sorted(partitions), pk_ranges):
            if pk < after[0]:
                continue
            part = partitions[pk]
            for rk in _candidates(part, node, rk_ranges):
                if (pk, rk) < after:
                    continue
                entity = part.rows[rk][0]
                if node is not None and not odata.matches(node, entity):
                    continue
                if len(out) == top:
                    more = (pk, rk)
                    break
                out.append((part, rk))
            if more:
                break
        select = [s for s in (query.get("$select") or "").split(",") if s]
        extra = ({"x-ms-continuation-NextPartitionKey": more[0], "x-ms-continuation-NextRowKey": more[1]}
                 if more else {})
        if select:
            return _json(200, {"value": [_shown(*part.rows[rk], select) for part, rk in out]}, extra)
        for part, rk in out:
            if rk not in part.shown:
                part.shown[rk] = json.dumps(_shown(*part.rows[rk]))
        body = '{"value": [' + ", ".join(part.shown[rk] for part, rk in out) + "]}"
        return 200, {"Content-Type": "application/json;odata=minimalmetadata", **extra}, body.encode()

    def _batch(self, headers: Dict[str, str], body: bytes) -> Answer:
        """One changeset, all or nothing: the operations run on a copy of the partitions they touch
        and are kept only if every one succeeded."""
        boundary = headers.get("Content-Type", "").split("boundary=", 1)[-1]
        text = body.decode("utf-8")
        changeset = re.search(r"boundary=(changeset_[^\s;]+)", text)
        if not changeset:
            raise Failure(400, "InvalidInput", "a $batch without a changeset")
        parts = [p for p in text.split("--" + changeset.group(1))[1:] if not p.startswith("--")]
        self._journal = []
        answers: List[str] = []
        try:
            for index, raw in enumerate(parts):
                request = re.split(r"\r?\n\r?\n", raw, maxsplit=1)[-1]  # after the part's own headers
                answers.append(self._batch_op(index, request.replace("\r\n", "\n")))
        except Failure as f:
            for part, row, had in reversed(self._journal):  # undo: nothing of the changeset stays
                if had is None:
                    part.drop(row)
                else:
                    part.put(row, had)
            error = json.dumps({"odata.error": {"code": f.code, "message": {
                "lang": "en-US", "value": f"{len(answers)}:{f.message}"}}})
            answers = [f"HTTP/1.1 {f.status} {REASONS.get(f.status, 'Error')}\r\n"
                       f"Content-ID: {len(answers) + 1}\r\nDataServiceVersion: 3.0;\r\n"
                       "Content-Type: application/json;odata=minimalmetadata;"
                       f"charset=utf-8\r\n\r\n{error}"]
        finally:
            self._journal = None
        out_changeset = "changesetresponse_" + changeset.group(1).split("_", 1)[-1]
        out_batch = "batchresponse_" + boundary.split("_", 1)[-1]
        chunks = [f"--{out_batch}\r\nContent-Type: multipart/mixed; boundary={out_changeset}\r\n\r\n"]
        for a in answers:
            chunks.append(f"--{out_changeset}\r\nContent-Type: application/http\r\n"
                          f"Content-Transfer-Encoding: binary\r\n\r\n{a}\r\n")
        chunks.append(f"--{out_changeset}--\r\n--{out_batch}--\r\n")
        return 202, {"Content-Type": f"multipart/mixed; boundary={out_batch}"}, "".join(chunks).encode()

    def _batch_op(self, index: int, raw: str) -> str:
        found = _PART.match(raw.strip("\n"))
        if not found:
            raise Failure(400, "InvalidInput", "an operation of the $batch cannot be read")
        method, url, head, payload = found.groups()
        sub_headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in head.split("\n") if ":" in line)}
        path = unquote(urlsplit(url).path).split("/", 2)[-1]
        entity = json.loads(payload) if payload and payload.strip() else {}
        entity_path = _ENTITY_PATH.match(path)
        if method == "POST":
            table, pk, rk = path, entity.get("PartitionKey", ""), entity.get("RowKey", "")
        elif entity_path:
            table, pk, rk = entity_path.group(1), _key(entity_path.group(2)), _key(entity_path.group(3))
        else:
            raise Failure(400, "InvalidInput", f"{method} {path} in a $batch")
        etag = self._write(method, table, pk, rk, entity, sub_headers.get("if-match"))
        return ("HTTP/1.1 204 No Content\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-cache\r\n"
                "DataServiceVersion: 3.0;\r\n" + (f"ETag: {etag}\r\n" if etag else "") + "\r\n")

    # ---- queues ---------------------------------------------------------------------------------
    def _queue(self, method: str, path: str, query: Dict[str, str]) -> Answer:
        name, _, rest = path.partition("/")
        if method == "PUT" and not rest:
            created = name not in self.queues
            self.queues.setdefault(name, 0)
            return (201 if created else 204), {}, b""
        if method == "POST" and rest == "messages":
            if name not in self.queues:
                return 404, {"x-ms-error-code": "QueueNotFound", "Content-Type": "application/xml"}, (
                    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>QueueNotFound</Code>'
                    b"<Message>The specified queue does not exist.</Message></Error>")
            self.queues[name] += 1
            now = datetime.now(timezone.utc)
            ttl = int(query.get("messagettl") or 7 * 86400)
            stamp = format_datetime(now, usegmt=True)
            ends = format_datetime(now + timedelta(seconds=max(ttl, 0)), usegmt=True)
            xml = ('<?xml version="1.0" encoding="UTF-8"?><QueueMessagesList><QueueMessage>'
                   f"<MessageId>{uuid.uuid4()}</MessageId><InsertionTime>{stamp}</InsertionTime><ExpirationTime>{ends}</ExpirationTime>"
                   f"<PopReceipt>memory</PopReceipt><TimeNextVisible>{stamp}</TimeNextVisible></QueueMessage>"
                   "</QueueMessagesList>")
            return 201, {"Content-Type": "application/xml"}, xml.encode()
        raise Failure(400, "InvalidInput", f"queue {method} {path}: not in the subset this stand-in answers")


REASONS = {200: "OK", 201: "Created", 202: "Accepted", 204: "No Content", 400: "Bad Request",
            404: "Not Found", 409: "Conflict", 412: "Precondition Failed"}


def _key(text: str) -> str:
    return text.replace("''", "'")


def _filter(text: Optional[str]) -> Optional[odata.Node]:
    if not text:
        return None
    try:
        return odata.parse(text)
    except odata.FilterError as exc:
        raise Failure(400, "InvalidInput", str(exc)) from None


def _candidates(part: Partition, node: Optional[odata.Node],
                ranges: Optional[List[odata.Range]]) -> List[str]:
    """The RowKeys a filter can match, in order: by key range, else through the narrowest equality index."""
    if ranges is None:
        found = [part.lookup(prop, values) for prop in odata.compared_props(node)
                 if prop not in ("PartitionKey", "RowKey")
                 for values in [odata.equal_values(node, prop)] if values is not None]
        if found:
            return min(found, key=len)
    return _in_ranges(part.keys, ranges)


def _in_ranges(keys: List[str], ranges: Optional[List[odata.Range]]) -> List[str]:
    """The keys (sorted) inside any of `ranges`, in order, once each."""
    if ranges is None:
        return list(keys)
    picked = set()
    for lo, lo_in, hi, hi_in in ranges:
        start = 0 if lo is None else (bisect.bisect_left if lo_in else bisect.bisect_right)(keys, lo)
        end = len(keys) if hi is None else (bisect.bisect_right if hi_in else bisect.bisect_left)(keys, hi)
        picked.update(range(start, end))
    return [keys[i] for i in sorted(picked)]


def _shown(entity: Dict[str, Any], etag: str, select: Optional[List[str]] = None) -> Dict[str, Any]:
    if select:
        kept = {k: v for k, v in entity.items() if k in select or k.split("@", 1)[0] in select}
    else:
        kept = dict(entity)
    return {"odata.etag": etag, **kept, **({} if select else {"Timestamp@odata.type": "Edm.DateTime"})}


def _json(status: int, value: Dict[str, Any], extra: Optional[Dict[str, str]] = None) -> Answer:
    headers = {"Content-Type": "application/json;odata=minimalmetadata", **(extra or {})}
    return status, headers, json.dumps(value).encode()


def _error(f: Failure) -> Answer:
    body = {"odata.error": {"code": f.code, "message": {"lang": "en-US", "value": f.message}}}
    return _json(f.status, body, {"x-ms-error-code": f.code})
