"""One Table storage entity-group transaction (upsert-merge only), written on the wire directly.

azure-data-tables' submit_transaction builds the multipart body through the email package and runs
pipeline policies for every sub-request: ~1 ms per entity, more than the round trip itself. This
module writes the same OData JSON batch body as text and sends it once through the TableClient's own
pipeline (credential, retries, request counting all apply), reusing the SDK's serialisation of
entity values. Any failure falls back to submit_transaction (see store.TableLog._submit), which
gives the SDK's precise errors.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Dict, List
from urllib.parse import quote

from azure.core.exceptions import HttpResponseError
from azure.core.rest import HttpRequest
from azure.data.tables import TableClient
from azure.data.tables._serialize import _add_entity_properties, _prepare_key  # pinned SDK (12.7.0)

_STATUS = re.compile(rb"^HTTP/1\.1 (\d{3})", re.MULTILINE)


def _url_key(key: str) -> str:
    """A key inside the sub-request's URL: quotes doubled (OData) then percent-encoded, as the SDK does
    (a raw space or '%' would break the request line)."""
    return quote(_prepare_key(key), safe="")


class WireBatchError(RuntimeError):
    """The service refused the transaction; the caller retries through the SDK for a precise error."""


def upsert_merge(client: TableClient, entities: List[Dict[str, Any]]) -> None:
    """Upsert-merge `entities` (one partition, <= 100) as one transaction: one HTTP request."""
    base = f"{client.scheme}://{client._primary_hostname}"
    batch = f"batch_{uuid.uuid4()}"
    changeset = f"changeset_{uuid.uuid4()}"
    parts = [f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"]
    for i, entity in enumerate(entities):
        payload = json.dumps(_add_entity_properties(entity))
        url = (
            f"{base}/{client.table_name}(PartitionKey='{_url_key(entity['PartitionKey'])}',"
            f"RowKey='{_url_key(entity['RowKey'])}')"
        )
        parts.append(
            f"--{changeset}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
            f"Content-ID: {i}\r\n\r\nPATCH {url} HTTP/1.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload.encode('utf-8'))}\r\nAccept: application/json\r\n"
            f"DataServiceVersion: 3.0\r\n\r\n{payload}\r\n"
        )
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
        raise WireBatchError(f"transaction answered HTTP {response.status_code}")
    statuses = [int(s) for s in _STATUS.findall(body)]
    if not statuses or any(s >= 300 for s in statuses):
        raise WireBatchError(f"transaction refused: sub-responses {statuses[:5]}")


__all__ = ["HttpResponseError", "WireBatchError", "upsert_merge"]
