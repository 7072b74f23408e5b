"""Table storage transactions and queries, written on the wire directly.

azure-data-tables' submit_transaction builds the multipart body through the email package and runs
pipeline policies for every sub-request: ~1 ms per entity, more than the round trip itself. This
module writes the same OData JSON batch body as text and sends it once through the TableClient's own
pipeline (credential, retries, request counting all apply), reusing the SDK's serialisation of
entity values. Its `query` sends query_entities' own request the same way and converts each entity with
the SDK's converter, skipping the generated client's model pass over the answer (client CPU per query:
`python -m bench.wire_query`, figures in docs/sizing.md). It is the only module that
touches the SDK's private parts (pinned 12.7.0); its tests (tests/central/test_store.py) check that it
stores what submit_transaction stores and reads what query_entities reads.

Operations (kind, entity, etag): "upsert" (merge, creating the row), "merge" / "replace" (the row
must exist and carry `etag`: If-Match), "insert" (the row must not exist), "delete" (If-Match).
The answer is the new ETag of each operation (None for a delete).
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import quote

from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    map_error,
)
from azure.core.rest import HttpRequest
from azure.data.tables import TableClient, TableEntity
from azure.data.tables._deserialize import _convert_to_entity  # pinned SDK (12.7.0)
from azure.data.tables._serialize import (  # pinned SDK (12.7.0)
    _add_entity_properties,
    _parameter_filter_substitution,
    _prepare_key,
)

from central.model.times import aware

WireOp = Tuple[str, Dict[str, Any], Optional[str]]
_SUBRESPONSE = re.compile(rb"HTTP/1\.1 (\d{3})[^\r\n]*\r\n(.*?)\r\n\r\n(.*?)(?=\r\n--|\Z)", re.DOTALL)
_ETAG = re.compile(rb"^ETag:\s*(.+?)\s*$", re.MULTILINE | re.IGNORECASE)
_CONTENT_ID = re.compile(rb"^Content-ID:\s*(\d+)\s*$", re.MULTILINE | re.IGNORECASE)
_CONTINUATION = {"NextPartitionKey": "x-ms-continuation-NextPartitionKey",
                 "NextRowKey": "x-ms-continuation-NextRowKey"}
_QUERY_ERRORS = {401: ClientAuthenticationError, 404: ResourceNotFoundError, 409: ResourceExistsError}
_METHODS = {"upsert": "PATCH", "merge": "PATCH", "replace": "PUT", "insert": "POST", "delete": "DELETE"}


def _url_key(key: str) -> str:
    """A key inside the sub-request's URL: quotes doubled (OData) then percent-encoded, as the SDK does
    (a raw space or '%' would break the request line)."""
    return quote(_prepare_key(key), safe="")


class WireBatchError(RuntimeError):
    """The service refused the transaction: `status` of the failed operation, its `index` (when the
    service names it), the error `code` and message. status 0: the answer could not be read."""

    def __init__(self, message: str, status: int = 0, index: int = -1, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.index = index
        self.code = code


def _part(base: str, table: str, i: int, kind: str, entity: Dict[str, Any], etag: Optional[str]) -> str:
    method = _METHODS[kind]
    if kind == "insert":
        url = f"{base}/{table}"
    else:
        url = (f"{base}/{table}(PartitionKey='{_url_key(entity['PartitionKey'])}',"
               f"RowKey='{_url_key(entity['RowKey'])}')")
    headers = "Accept: application/json;odata=minimalmetadata\r\nDataServiceVersion: 3.0\r\n"
    if kind in ("merge", "replace", "delete"):
        headers += f"If-Match: {etag or '*'}\r\n"
    if kind == "insert":
        headers += "Prefer: return-no-content\r\n"
    payload = "" if kind == "delete" else json.dumps(_add_entity_properties(entity))
    if payload:
        headers += f"Content-Type: application/json\r\nContent-Length: {len(payload.encode('utf-8'))}\r\n"
    return (f"Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\nContent-ID: {i}\r\n\r\n"
            f"{method} {url} HTTP/1.1\r\n{headers}\r\n{payload}\r\n")


def transact(client: TableClient, ops: Sequence[WireOp]) -> List[Optional[str]]:
    """Run `ops` (one partition, <= 100) as one transaction: one HTTP request. Returns each op's ETag."""
    base = f"{client.scheme}://{client._primary_hostname}"
    batch = f"batch_{uuid.uuid4()}"
    changeset = f"changeset_{uuid.uuid4()}"
    parts = [f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"]
    for i, (kind, entity, etag) in enumerate(ops):
        parts.append(f"--{changeset}\r\n" + _part(base, client.table_name, i, kind, entity, etag))
    parts.append(f"--{changeset}--\r\n\r\n--{batch}--\r\n")
    request = HttpRequest(
        "POST",
        f"{base}/$batch",
        headers={
            "x-ms-version": client.api_version,
            "DataServiceVersion": "3.0",
            "MaxDataServiceVersion": "3.0;NetFx",
            "Content-Type": f"multipart/mixed; boundary={batch}",
            "Accept": "application/json",
        },
        content="".join(parts).encode("utf-8"),
    )
    # stream=True: the pipeline's content decoder cannot read multipart; the body is read here
    response = client._client.send_request(request, stream=True)
    body = response.read()
    if response.status_code != 202:
        raise WireBatchError(f"transaction answered HTTP {response.status_code}", response.status_code)
    subs = _SUBRESPONSE.findall(body)
    statuses = [int(s) for s, _, _ in subs]
    failed = [(n, s) for n, s in enumerate(statuses) if s >= 300]
    if failed or len(statuses) != len(ops):
        n, status = failed[0] if failed else (0, 0)
        raise _failure(subs[n] if subs else (b"0", b"", b""), status, len(ops))
    return [_etag(headers) for _, headers, _ in subs]


def _etag(headers: bytes) -> Optional[str]:
    found = _ETAG.search(headers)
    return found.group(1).decode("ascii", "replace") if found else None


def _failure(sub: Tuple[bytes, bytes, bytes], status: int, count: int) -> WireBatchError:
    """The failed operation: its index from the error message's "N:" prefix (else Content-ID)."""
    _, headers, payload = sub
    code, message, index = "", payload.decode("utf-8", "replace")[:300], -1
    try:
        error = json.loads(payload.decode("utf-8")).get("odata.error", {})
        code = str(error.get("code", ""))
        message = str((error.get("message") or {}).get("value", ""))[:300]
    except (ValueError, AttributeError):
        pass
    head = message.split(":", 1)[0]
    found = _CONTENT_ID.search(headers)
    if head.isdigit():  # the service's own "N:" prefix is the 0-based index of the failed operation
        index = int(head)
    elif count == 1:
        index = 0
    elif found:
        index = int(found.group(1))
    return WireBatchError(f"operation {index} refused: HTTP {status} {code}: {message}", status, index, code)


def upsert_merge(client: TableClient, entities: List[Dict[str, Any]]) -> None:
    """Upsert-merge `entities` (one partition, <= 100) as one transaction (the log tables' writes)."""
    transact(client, [("upsert", e, None) for e in entities])


def plain_times(entity: Dict[str, Any]) -> None:
    """The entity's Edm.DateTime properties (not the service's Timestamp) as plain UTC datetimes, parsed by
    datetime.fromisoformat (~0.1 us each), before the SDK's conversion: it parses each with strptime (~5 us),
    ~60 % of converting a State row, and a cache following another instance converts every row that
    instance changes (issue 24). A text fromisoformat does not read (unpadded fields, which strptime takes;
    anything before Python 3.11, which reads no 'Z') keeps its annotation: the SDK parses it, as before."""
    for key in [k for k in entity if k.endswith("@odata.type") and entity[k] == "Edm.DateTime"]:
        name = key[:-len("@odata.type")]
        value = entity.get(name)
        if name == "Timestamp" or not isinstance(value, str):
            continue
        try:
            entity[name] = aware(datetime.fromisoformat(value))
        except ValueError:
            continue
        del entity[key]


def _query_value(text: str) -> str:
    return quote(text, safe="")


def query(client: TableClient, filter_: str, parameters: Dict[str, Any], select: Optional[List[str]] = None,
          per_page: int = 1000, timestamps: bool = True) -> List[TableEntity]:
    """Every entity query_entities(filter_, parameters=...) yields, page after page: the same request and the
    SDK's own conversion of each entity (_convert_to_entity), without the generated client's model
    deserialisation of the answer first, which walked every property of every entity (~7 % of central's
    CPU in a 100k wave, issue 24). `timestamps=False`: the service's Timestamp is left out of each entity's
    metadata (None) instead of parsed, for callers that keep only the ETag: the SDK parses it with strptime,
    ~5 % of central's CPU in that wave (an entity without its own odata.etag keeps it: the SDK derives the
    ETag from it). Edm.DateTime values come back as plain datetimes (`plain_times`), equal to the SDK's own
    datetime subclass, where fromisoformat reads them. Raises HttpResponseError when the service refuses the
    query."""
    base = f"{client.scheme}://{client._primary_hostname}"
    # each value percent-encoded whole, as the SDK's request builder does (azure-core joins params as given:
    # a key holding '&', '+' or '%27' would otherwise cut or rewrite the filter)
    where = _parameter_filter_substitution(parameters, filter_)
    params = {"$filter": _query_value(where), "$top": str(per_page)}
    if select:
        params["$select"] = _query_value(",".join(select))
    headers = {"x-ms-version": client.api_version, "DataServiceVersion": "3.0",
               "Accept": "application/json;odata=minimalmetadata"}
    out: List[TableEntity] = []
    while True:
        request = HttpRequest("GET", f"{base}/{quote(client.table_name)}()", params=params, headers=headers)
        response = client._client.send_request(request)
        if response.status_code != 200:
            map_error(response.status_code, response, _QUERY_ERRORS)  # the SDK's types (404: no table)
            raise HttpResponseError(message=f"query answered HTTP {response.status_code}: "
                                            f"{response.text()[:300]}", response=response)
        values = response.json().get("value", [])
        for entity in values:
            if not timestamps and "odata.etag" in entity:
                entity.pop("Timestamp", None)
            plain_times(entity)
        out.extend(_convert_to_entity(entity) for entity in values)
        tokens = {name: response.headers.get(header) for name, header in _CONTINUATION.items()}
        if not any(tokens.values()):
            return out
        for name, token in tokens.items():  # only the tokens the service gave, as the SDK sends them
            if token:
                params[name] = _query_value(token)
            else:
                params.pop(name, None)


__all__ = ["HttpResponseError", "WireBatchError", "WireOp", "plain_times", "query", "transact",
           "upsert_merge"]
