"""The Event Hubs REST send endpoint (HTTP/1.1 on loopback), as Azure documents it ("Send event", "Send batch
events", "Event Hubs service REST - Common parameters and headers"):

    POST /{hub}/messages[?timeout=60&api-version=2014-01]
    Authorization: Bearer <Microsoft Entra token for https://eventhubs.azure.net> | SharedAccessSignature ...
    Content-Type: application/vnd.microsoft.servicebus.json   (a batch:
        [{"Body": "...", "UserProperties": {...}, "BrokerProperties": {"PartitionKey": "..."}}, ...])
    or any other Content-Type: one event, the request body its body, BrokerProperties in a header.
    -> 201 (empty body); 400 malformed; 401 no/expired/wrong-audience token; 404 unknown hub;
       413 larger than --max-message-bytes; faults armed through POST /$sandbox/faults.

Each event is stored as the AMQP message an AMQP producer would have sent (data section = the body's UTF-8
bytes, application properties = UserProperties, annotation x-opt-partition-key = PartitionKey), so the
unmodified azure-eventhub consumer reads it back. Tokens are checked as the AMQP side's $cbs and Azurite's
`--oauth basic` do: shape, audience and lifetime, not the signature (the sandbox has no Entra ID).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from ..bearer import bearer_problem
from .codec import Message, encode_message
from .publish import PARTITION_KEY, publish
from .store import Broker

BATCH_TYPE = "application/vnd.microsoft.servicebus.json"
AUDIENCES = ("https://eventhubs.azure.net", "https://eventhubs.azure.net/", "https://servicebus.azure.net")
MAX_HEADER_BYTES = 64 * 1024
DEFAULT_MAX_MESSAGE = 1024 * 1024  # Standard tier: 1 MB per event or batch


class HttpError(Exception):
    def __init__(self, status: int, code: str, detail: str, headers: Optional[Dict[str, str]] = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.headers = status, code, headers or {}


def token_problem(authorization: str, now: float) -> str:
    """'' when the header carries a usable token, else why not (the 401's detail)."""
    scheme, _, token = authorization.partition(" ")
    if scheme == "SharedAccessSignature":
        return "" if "sig=" in token and "se=" in token else "malformed SharedAccessSignature"
    return bearer_problem(authorization, AUDIENCES, "Event Hubs", now)


def messages_of(content_type: str, body: bytes, headers: Dict[str, str]) -> List[Tuple[bytes, Dict, Any]]:
    """(body bytes, application properties, partition key) per event in the request; HttpError 400."""
    if content_type.split(";")[0].strip().lower() == BATCH_TYPE:
        try:
            items = json.loads(body)
        except ValueError as exc:
            raise HttpError(400, "BadRequest", f"the batch is not JSON: {exc}") from exc
        if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("Body"), str)
                                                  for i in items):
            raise HttpError(400, "BadRequest", 'a batch is a JSON array of {"Body": "..."} objects')
        out = []
        for item in items:
            props = item.get("UserProperties")
            broker = item.get("BrokerProperties")
            props = {} if props is None else props
            broker = {} if broker is None else broker
            if not isinstance(props, dict) or not isinstance(broker, dict):
                raise HttpError(400, "BadRequest", "UserProperties and BrokerProperties are JSON objects")
            out.append((item["Body"].encode("utf-8"), props, broker.get("PartitionKey")))
        return out
    broker_text = headers.get("brokerproperties", "")
    try:
        broker = json.loads(broker_text) if broker_text else {}
    except ValueError as exc:
        raise HttpError(400, "BadRequest", f"BrokerProperties is not JSON: {exc}") from exc
    return [(body, {}, broker.get("PartitionKey") if isinstance(broker, dict) else None)]


class RestFront:
    """The HTTP front over one Broker. Faults: the next `count` sends answer `status` (Retry-After)."""

    def __init__(self, broker: Broker, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self.broker = broker
        self.max_message = max_message
        self.faults: List[Dict[str, Any]] = []
        self.requests: List[Dict[str, Any]] = []  # method, path, status, headers (for tests)

    def answer(self, method: str, target: str, headers: Dict[str, str],
               body: bytes) -> Tuple[int, Dict, bytes]:
        path = urlsplit(target).path
        try:
            status = self._route(method, path, headers, body)
            reply: Tuple[int, Dict, bytes] = (status, {}, b"")
        except HttpError as exc:
            detail = f"<Error><Code>{exc.status}</Code><Detail>{exc.code}: {exc}</Detail></Error>"
            reply = (exc.status, {"Content-Type": "application/xml; charset=utf-8", **exc.headers},
                     detail.encode())
        self.requests.append({"method": method, "path": target, "status": reply[0],
                              "headers": {k: v for k, v in headers.items() if k != "authorization"}})
        del self.requests[:-1000]
        return reply

    def _route(self, method: str, path: str, headers: Dict[str, str], body: bytes) -> int:
        if path == "/$sandbox/faults" and method == "POST":
            fault = json.loads(body or b"{}")
            self.faults.append({"status": int(fault.get("status", 503)), "count": int(fault.get("count", 1)),
                                "retryAfter": fault.get("retryAfter")})
            return 201
        parts = [p for p in path.split("/") if p]
        if method != "POST" or len(parts) != 2 or parts[1] != "messages":
            raise HttpError(404, "NotFound", f"no REST endpoint {method} {path} (POST /{{hub}}/messages)")
        problem = token_problem(headers.get("authorization", ""), time.time())
        if problem:
            raise HttpError(401, "Unauthorized", problem)
        hub = self.broker.hub(parts[0])
        if hub is None:
            raise HttpError(404, "MessagingEntityNotFound", f"the event hub {parts[0]!r} does not exist")
        if self.faults:
            fault = self.faults[0]
            fault["count"] -= 1
            if fault["count"] <= 0:
                self.faults.pop(0)
            after = {"Retry-After": str(fault["retryAfter"])} if fault["retryAfter"] is not None else {}
            raise HttpError(fault["status"], "ServerBusy", "injected fault", after)
        if len(body) > self.max_message:
            raise HttpError(413, "MessageSizeExceeded",
                            f"the request is {len(body)} bytes; at most {self.max_message} are accepted")
        events = messages_of(headers.get("content-type", ""), body, headers)
        for data, props, key in events:
            annotations = {PARTITION_KEY: str(key)} if key is not None else None
            message = Message(data=[data], application_properties=props or None,
                              message_annotations=annotations)
            publish(hub, None, encode_message(message), None)
        return 201


async def serve_http(front: RestFront, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 with keep-alive: request line, headers, a Content-Length body; until the client closes."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if len(head) > MAX_HEADER_BYTES:
                break
            lines = head.decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
            status, extra, payload = front.answer(method, target, headers, body)
            reason = {201: "Created", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
                      413: "Request Entity Too Large", 429: "Too Many Requests",
                      503: "Service Unavailable"}.get(status, "Error")
            out = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(payload)}", *(
                f"{k}: {v}" for k, v in extra.items())]
            writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + payload)
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                break
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()
