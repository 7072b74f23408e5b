"""How the SDKs reach bench.table_memory's MemoryStorage: in-process (`session()`, a `requests`
transport adapter mounted on azure-core's RequestsTransport session: the SDK's whole pipeline runs, only
the socket is skipped; `direct_session()`, the same without requests' own per-request preparation) or over
loopback HTTP (`serve()`, for tests that want real sockets).
"""

from __future__ import annotations

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, List, Tuple

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from requests.utils import requote_uri
from urllib3 import HTTPResponse

from bench.table_memory import BLOB_PORT, QUEUE_PORT, REASONS, TABLE_PORT, MemoryStorage


def connection_string() -> str:
    """An Azurite-shaped connection string whose endpoints only this stand-in answers."""
    from sandbox.processes import azurite_connection_string

    return azurite_connection_string(BLOB_PORT, QUEUE_PORT, TABLE_PORT)



class MemoryAdapter(BaseAdapter):
    """A `requests` adapter answering from a MemoryStorage: what a socket to the service would bring."""

    def __init__(self, storage: MemoryStorage) -> None:
        super().__init__()
        self.storage = storage

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, bytes):
            body = body.read() if hasattr(body, "read") else b"".join(body)
        status, headers, payload = self.storage.handle(request.method or "GET", request.url or "",
                                                       dict(request.headers), body)
        raw = HTTPResponse(body=io.BytesIO(payload), headers={**headers, "Content-Length": str(len(payload))},
                           status=status, reason=REASONS.get(status, ""), preload_content=False,
                           decode_content=False)
        response = requests.Response()
        response.status_code, response.raw, response.url = status, raw, request.url or ""
        response.headers = requests.structures.CaseInsensitiveDict(raw.headers)
        response.reason, response.request, response.encoding = raw.reason, request, "utf-8"
        return response

    def close(self) -> None:
        pass


def session(storage: MemoryStorage) -> requests.Session:
    """A requests session whose loopback traffic to the stand-in's ports goes to `storage`."""
    s = requests.Session()
    s.trust_env = False  # no proxy / netrc look-ups in the environment on every request
    adapter = MemoryAdapter(storage)
    for port in (TABLE_PORT, QUEUE_PORT, BLOB_PORT):
        s.mount(f"http://127.0.0.1:{port}/", adapter)
    return s


class DirectSession(requests.Session):
    """A session that hands each request to the stand-in's adapter as azure-core gives it (URL requoted as
    requests does), without requests' per-request preparation (merging session settings, cookie jars,
    parsing the URL again: ~10 % of a 100k wave's CPU, in a library that in Azure drives a socket).
    azure-core's RequestsTransport and everything above it run unchanged. A request with files or a
    streamed body goes the whole way."""

    def __init__(self, adapter: MemoryAdapter) -> None:
        super().__init__()
        self.trust_env = False
        self.adapter = adapter

    def request(self, method: str, url: str, headers: Any = None, data: Any = None,  # type: ignore[override]
                files: Any = None, **kwargs: Any) -> requests.Response:
        if files or not isinstance(data, (bytes, str, type(None))):
            return super().request(method, url, headers=headers, data=data, files=files, **kwargs)
        prepared = requests.PreparedRequest()
        prepared.method, prepared.url = method.upper(), requote_uri(url)
        prepared.headers = CaseInsensitiveDict(headers or {})
        prepared.body = data
        return self.adapter.send(prepared)


def direct_session(storage: MemoryStorage) -> requests.Session:
    """`session()` without requests' per-request preparation (DirectSession)."""
    adapter = MemoryAdapter(storage)
    s = DirectSession(adapter)
    for port in (TABLE_PORT, QUEUE_PORT, BLOB_PORT):
        s.mount(f"http://127.0.0.1:{port}/", adapter)
    return s


def serve(storage: MemoryStorage) -> Tuple[List[ThreadingHTTPServer], str]:
    """The same service behind loopback HTTP servers (tables, queues; each in a thread: `shutdown()`
    them). Returns the servers and a connection string pointing at them."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(storage, kind))
               for kind in (TABLE_PORT, QUEUE_PORT)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    from sandbox.processes import azurite_connection_string

    table, queue = (server.server_address[1] for server in servers)
    return servers, azurite_connection_string(queue, queue, table)


def _handler(storage: MemoryStorage, kind: int) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            url = f"http://127.0.0.1:{kind}{self.path}"
            status, headers, payload = storage.handle(self.command, url, dict(self.headers), body)
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(payload))}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = do_PUT = do_PATCH = do_MERGE = do_DELETE = _any

        def log_message(self, *args: Any) -> None:
            pass

    return Handler
