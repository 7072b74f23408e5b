"""This VM's approval queue through the Queue service's documented REST API over http.client (HTTPS), with
the managed identity's Bearer token: the production path (forwarder/approvals/queue.py picks it).

Why: the forwarder makes three kinds of call, only while an event naming its VM is open; for those
azure-storage-queue with azure-core, requests and cryptography cost 4.3 MiB of RSS with an event open
and nine packages on every VM (docs/forwarder.md, "Footprint").

The contract (learn.microsoft.com/rest/api/storageservices: "Get Messages", "Peek Messages", "Delete
Message", "Put Message", "Authorize with Microsoft Entra ID"): requests carry `Authorization: Bearer
<token for https://storage.azure.com/>` and `x-ms-version` (2017-11-09 or later for Entra tokens);
`GET /<queue>/messages?numofmessages=N&visibilitytimeout=S` answers 200 with a `QueueMessagesList` XML
document (MessageId, PopReceipt, DequeueCount, MessageText); `?peekonly=true` reads without dequeuing;
`DELETE /<queue>/messages/<id>?popreceipt=<r>` answers 204; `POST /<queue>/messages` with
`<QueueMessage><MessageText>...</MessageText></QueueMessage>` answers 201. MessageText is returned as
stored (no base64 decoding), as the SDK does without a decode policy. Every non-2xx answer raises
QueueError with the service's error code (404: QueueNotFound) and its Retry-After, which the
reader honours; it retries with its own jittered backoff. A refused token (401, or Storage's 403
AuthenticationFailed) is dropped from the cache, so the next call fetches a new one.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from typing import Any, List, Optional
from urllib.parse import quote, urlencode, urlsplit

from ..credential import retry_after
from ..imds_http import _STALE, Answer

SCOPE = "https://storage.azure.com/.default"
API_VERSION = "2025-11-05"
TIMEOUT = 20.0  # seconds per exchange (connect, read), as the SDK client's read_timeout was
TOKEN_REFUSED = frozenset({"AuthenticationFailed", "InvalidAuthenticationInfo"})  # expired, wrong audience
MAX_BODY = 4 * 1024 * 1024  # 32 messages of 64 KiB, base64-grown, and the XML around them


class QueueError(Exception):
    """The queue service refused or did not answer; `status` 0 = no answer."""

    def __init__(self, message: str, status: int = 0, code: str = "",
                 retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.status, self.code, self.retry_after = status, code, retry_after


class QueueNotFound(QueueError):
    """HTTP 404: the queue does not exist (yet; central creates it with its first approval for this VM),
    or the message is gone (as azure-core's ResourceNotFoundError, any 404)."""


@dataclass
class QueueMessage:
    id: str
    pop_receipt: str
    content: str
    dequeue_count: int


def parse_messages(xml_text: str) -> List[QueueMessage]:
    """The messages of a Get/Peek Messages answer (a peek has no PopReceipt)."""
    root = ElementTree.fromstring(xml_text)  # noqa: S314 - the account's own answer, over verified TLS
    out = []
    for node in root.findall("QueueMessage"):
        out.append(QueueMessage(id=node.findtext("MessageId") or "",
                                pop_receipt=node.findtext("PopReceipt") or "",
                                content=node.findtext("MessageText") or "",
                                dequeue_count=int(node.findtext("DequeueCount") or 0)))
    return out


def error_code(answer: Answer) -> str:
    """The x-ms-error-code header, else the XML body's <Code>."""
    for name, value in answer.headers.items():
        if name.lower() == "x-ms-error-code":
            return value
    try:
        return ElementTree.fromstring(answer.text).findtext("Code") or ""  # noqa: S314
    except ElementTree.ParseError:
        return ""


class QueueRestClient:
    """receive_messages / peek_messages / delete_message / send_message / close, as the reader uses them."""

    def __init__(self, account_url: str, queue_name: str, credential: Any,
                 context: Optional[ssl.SSLContext] = None) -> None:
        parts = urlsplit(account_url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"the queue service URI must be https://<account>.queue.core.windows.net; "
                             f"got {account_url!r}")
        self.queue_name = queue_name
        self.credential = credential
        self.url = f"{account_url.rstrip('/')}/{queue_name}"
        self._host, self._port = parts.hostname, parts.port or 443
        self._prefix = parts.path.rstrip("/") + "/" + quote(queue_name)
        self._context = context
        self._conn: Optional[http.client.HTTPSConnection] = None
        self._lock = threading.Lock()
        self.requests = 0

    def receive_messages(self, messages_per_page: int = 32, max_messages: int = 32,
                         visibility_timeout: int = 30, **_: Any) -> List[QueueMessage]:
        count = max(1, min(32, max_messages, messages_per_page))
        query = {"numofmessages": count, "visibilitytimeout": int(visibility_timeout)}
        return parse_messages(self._call("GET", "/messages", query, None, 200).text)

    def peek_messages(self, max_messages: int = 1) -> List[QueueMessage]:
        query = {"peekonly": "true", "numofmessages": max(1, min(32, max_messages))}
        return parse_messages(self._call("GET", "/messages", query, None, 200).text)

    def delete_message(self, message_id: str, pop_receipt: str) -> None:
        self._call("DELETE", f"/messages/{quote(message_id)}", {"popreceipt": pop_receipt}, None, 204)

    def send_message(self, content: str) -> None:
        # ElementTree (loaded anyway to read the answers) escapes the text: not xml.sax.saxutils.escape,
        # which imports urllib.request (+1 MiB), nor html.escape, whose module loads HTML5's 2,231 entity
        # names (+0.7 MiB imported beside ElementTree)
        message = ElementTree.Element("QueueMessage")
        ElementTree.SubElement(message, "MessageText").text = content
        body = ElementTree.tostring(message, encoding="unicode").encode("utf-8")
        self._call("POST", "/messages", {}, body, 201)

    def _call(self, method: str, path: str, query: dict, body: Optional[bytes], ok: int) -> Answer:
        try:
            token = self.credential.get_token(SCOPE).token
        except Exception as exc:
            raise QueueError(f"no token for the queue: {type(exc).__name__}: {str(exc)[:300]}") from exc
        headers = {"Authorization": f"Bearer {token}", "x-ms-version": API_VERSION}
        if body is not None:
            headers["Content-Type"] = "application/xml; charset=utf-8"
        target = self._prefix + path + (f"?{urlencode(query)}" if query else "")
        answer = self._exchange(method, target, headers, body)
        if answer.status == ok:
            return answer
        code = error_code(answer)
        if answer.status == 401 or code in TOKEN_REFUSED:  # Storage answers 403 AuthenticationFailed
            forget = getattr(self.credential, "forget", None)
            if forget is not None:
                forget(SCOPE)
        kind = QueueNotFound if answer.status == 404 else QueueError
        raise kind(f"queue {self.queue_name}: HTTP {answer.status} {code or answer.text[:200]}",
                   answer.status, code, retry_after(answer))

    def _exchange(self, method: str, target: str, headers: dict, body: Optional[bytes]) -> Answer:
        with self._lock:  # one exchange at a time on the kept-alive connection
            if self._conn is None:
                if self._context is None:
                    from ..sinks.tls_trust import client_context

                    self._context = client_context()
                self._conn = http.client.HTTPSConnection(self._host, self._port, timeout=TIMEOUT,
                                                          context=self._context)
            conn, reused = self._conn, self.requests > 0
            self.requests += 1
            try:
                try:
                    conn.request(method, target, body=body, headers=headers)
                    response = conn.getresponse()
                except _STALE:
                    if not reused:
                        raise
                    conn.close()  # the service closed the idle kept-alive connection: once more, anew
                    conn.request(method, target, body=body, headers=headers)
                    response = conn.getresponse()
                data = response.read(MAX_BODY + 1)
                answer = Answer(response.status, dict(response.getheaders()),
                                data.decode("utf-8", errors="replace"))
                if response.will_close or len(data) > MAX_BODY:
                    self._drop()
                return answer
            except (OSError, http.client.HTTPException) as exc:
                self._drop()
                raise QueueError(f"queue {self.queue_name}: no answer ({type(exc).__name__}: {exc})") from exc

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._drop()
