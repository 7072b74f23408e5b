"""Azure Event Hubs through its documented REST send API, over the standard library's http.client (HTTPS).

Used with managed identity (the production path); the AMQP sink (forwarder/sinks/eventhub.py, the
azure-eventhub SDK) stays for connection strings, i.e. the emulator and the sandbox's AMQP server.
Why: a forwarder sends about one heartbeat a minute; for that the SDK's AMQP stack cost 3.5 MiB of RSS
at import and more per open connection, and three packages on every VM (docs/forwarder.md, "Footprint").

The contract (learn.microsoft.com/rest/api/eventhub: "Send batch events", "Common parameters and
headers"): `POST https://<namespace>/<hub>/messages?timeout=60&api-version=2014-01` with
`Authorization: Bearer <Microsoft Entra token for https://eventhubs.azure.net/.default>` and
`Content-Type: application/vnd.microsoft.servicebus.json`, the body a JSON array of
`{"Body": <the CloudEvent JSON>, "UserProperties": {<signature properties>},
"BrokerProperties": {"PartitionKey": <the scale set, else the vmId>}}`; 201 = stored.

What `send` does with the outbox's pending rows, as the AMQP sink: consecutive envelopes with one
partition key go in as few requests as fit under MAX_REQUEST bytes, one after another; an envelope
that cannot fit alone is replaced by a `quarantined` note; any failure raises SinkError and the
publisher keeps every row (a request already stored is sent again: same CloudEvent ids, consumers
dedupe). 400/403/404 are not retryable without an operator (a 401 also drops the cached token, so a
token the service calls expired is fetched anew); 429/503 and every other answer are retried by the
publisher with backoff, never sooner than the answer's Retry-After. The connection is kept alive
between sends and closed by `release()` (eventhub_idle_close) or after any failure; every exchange
is bounded by `send_timeout`. TLS verifies the namespace against the VM's hashed CA directory
(forwarder/sinks/tls_trust.py), else Python's default trust.
"""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any, Callable, Dict, List, Optional

from .. import logs
from ..credential import retry_after
from ..imds_http import Answer
from .base import SinkError
from .eventhub import EventHubSettings, _runs_by_partition_key, claimed_subscription
from .oversize import body_bytes, oversize_note
from .tls_trust import client_context

log = logs.get("sink.eventhub")

SCOPE = "https://eventhubs.azure.net/.default"
BATCH_TYPE = "application/vnd.microsoft.servicebus.json"
API_VERSION = "2014-01"
MAX_REQUEST = 1_000_000  # bytes per request: under Standard/Premium's 1 MB per batch, with room for headers
NOT_RETRYABLE = frozenset({400, 403, 404})  # 401: retried with a new token (it may have expired)


def batch_item(body: bytes, key: str, properties: Optional[Dict[str, str]]) -> bytes:
    """One event of a batch request, as JSON bytes."""
    item: Dict[str, Any] = {"Body": body.decode("utf-8")}
    if properties:
        item["UserProperties"] = properties
    item["BrokerProperties"] = {"PartitionKey": key}
    return json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def requests_for(items: List[bytes], limit: int = MAX_REQUEST) -> List[bytes]:
    """`items` packed in order into as few JSON arrays of at most `limit` bytes as fit (each fits alone)."""
    out: List[bytes] = []
    current: List[bytes] = []
    size = 2
    for item in items:
        if current and size + 1 + len(item) > limit:
            out.append(b"[" + b",".join(current) + b"]")
            current, size = [], 2
        current.append(item)
        size += len(item) + (1 if len(current) > 1 else 0)
    if current:
        out.append(b"[" + b",".join(current) + b"]")
    return out


class EventHubRestSink:
    """`send(envelopes)` publishes in order or raises SinkError; `release()` closes the idle connection."""

    def __init__(self, settings: EventHubSettings, credential: Any, authenticator: Any = None) -> None:
        settings.check()
        if settings.connection_string:
            raise SinkError("the REST sink authenticates with the managed identity, not a connection string",
                            retryable=False)
        self.settings = settings
        self.name = f"eventhub:{settings.target}"
        self._credential = credential
        self._conn: Optional[http.client.HTTPConnection] = None
        # one TLS context for every connection: the sink opens one per send after an idle close (a heartbeat
        # a minute), and a context made each time (a CA store, the CA read from disk) grew the RSS by
        # ~0.2 MiB a simulated day in the soak (docs/soak.md)
        self._lock = threading.Lock()
        self.oversize_replaced = 0
        self.requests = 0
        self.authenticator = authenticator
        self._sign: Optional[Callable[[bytes], Dict[str, str]]] = (
            authenticator.sign if authenticator is not None else None)

    # ---- sending -----------------------------------------------------------------------------

    def send(self, envelopes: List[Dict[str, Any]]) -> None:
        if not envelopes:
            return
        with self._lock:
            runs = _runs_by_partition_key(envelopes)
            if self.authenticator is not None:
                self._authenticate(claimed_subscription(envelopes))
            for key, run in runs:
                for body in requests_for([self._item(env, key) for env in run]):
                    self._post(body)

    def _item(self, env: Dict[str, Any], key: str) -> bytes:
        body = body_bytes(env)
        item = batch_item(body, key, self._sign(body) if self._sign else None)
        if len(item) + 2 <= MAX_REQUEST:
            return item
        self.oversize_replaced += 1
        note = oversize_note(env, MAX_REQUEST)
        log.error("envelope larger than the hub accepts; publishing a quarantined note instead so the "
                  "outbox is not blocked", extra=logs.fields(id=env.get("id"), type=env.get("type"),
                                                             bytes=len(body), limit=MAX_REQUEST,
                                                             noteId=note["id"]))
        note_body = body_bytes(note)
        return batch_item(note_body, key, self._sign(note_body) if self._sign else None)

    def _authenticate(self, subscription: str = "") -> None:
        from ..attestation import AttestationError

        try:
            self.authenticator.begin(subscription)
        except AttestationError as exc:
            raise SinkError(f"not sent unauthenticated: {exc}") from exc

    def _post(self, body: bytes) -> None:
        try:
            token = self._credential.get_token(SCOPE).token
        except Exception as exc:
            raise SinkError(f"{type(exc).__name__}: {str(exc)[:300]}; check the VM's managed identity "
                            "(client_id) has 'Azure Event Hubs Data Sender' on the hub",
                            retryable=False) from exc
        headers = {"Authorization": f"Bearer {token}", "Content-Type": BATCH_TYPE}
        path = f"/{self.settings.eventhub_name}/messages?timeout=60&api-version={API_VERSION}"
        answer = self._exchange(path, headers, body)
        if answer.status == 201:
            return
        if answer.status == 401:
            forget = getattr(self._credential, "forget", None)
            if forget is not None:
                forget(SCOPE)  # a token the service calls expired or wrong is never sent again
        hint = {401: "; check the VM's managed identity and its 'Azure Event Hubs Data Sender' role",
                403: "; the identity lacks 'Azure Event Hubs Data Sender' on the hub",
                404: "; check eventhub_namespace and eventhub_name"}.get(answer.status, "")
        error = SinkError(f"Event Hubs ({self.settings.target}) answered HTTP {answer.status}: "
                          f"{' '.join(answer.text.split())[:300]}{hint}",
                          retryable=answer.status not in NOT_RETRYABLE)
        error.retry_after = retry_after(answer)
        raise error

    def _exchange(self, path: str, headers: Dict[str, str], body: bytes) -> Answer:
        conn = self._connection()
        self.requests += 1
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read(64 * 1024).decode("utf-8", errors="replace")
            answer = Answer(response.status, dict(response.getheaders()), text)
            if response.will_close or not response.isclosed():
                self._close()
            elif answer.status != 201:
                self._close()  # a failure starts the next attempt on a fresh connection
            return answer
        except (OSError, http.client.HTTPException) as exc:
            self._close()
            raise SinkError(f"{type(exc).__name__}: {exc}; Event Hubs unreachable: kept in the outbox, "
                            "retrying with backoff") from exc

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            s = self.settings
            if s.use_tls:
                self._conn = http.client.HTTPSConnection(s.namespace, timeout=s.send_timeout,
                                                         context=client_context())
            else:  # the sandbox's REST endpoint on loopback (tests); never a production setting
                self._conn = http.client.HTTPConnection(s.namespace, timeout=s.send_timeout)
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def probe(self) -> int:
        """For `se-forwarder check`: a token for Event Hubs can be had (nothing is sent). Returns the most
        one request may carry."""
        try:
            self._credential.get_token(SCOPE)
        except Exception as exc:
            raise SinkError(f"{type(exc).__name__}: {str(exc)[:300]}", retryable=False) from exc
        return MAX_REQUEST

    def release(self) -> None:
        """Close the connection (idle); the next send opens a new one."""
        with self._lock:
            self._close()

    def close(self) -> None:
        self.release()
        close = getattr(self._credential, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - shutting down; nothing left to do with it
                log.debug("closing the credential raised; ignored")
