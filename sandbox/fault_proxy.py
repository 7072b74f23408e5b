"""Loopback stand-ins that sit between a client and a real server and break the path on demand, for the
fault suite and the benchmarks (real sockets both sides; started in the caller's process, on threads).

- `HttpProxy`: an HTTP/1.1 reverse proxy to one port (e.g. one of Azurite's services). It counts requests
  by (method, first path segment after the account: a queue's or a table's name), logs the last LOG_LIMIT of
  them with their times, and for a window answers
  every request with a chosen status instead of forwarding it: 503 ServerBusy, 500 InternalError or 429 with
  a Retry-After header, in the body and `x-ms-error-code` Azure Storage answers with (XML for blob and queue,
  JSON for table), so the Azure SDKs' own retry policies see what they would see from Azure.
- `TcpGate`: a TCP relay to one port (e.g. the Event Hubs AMQP server) that can be cut: while down it
  closes every open connection and every new one as soon as it is accepted (the server unreachable).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import BaseRequestHandler, ThreadingTCPServer
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from sandbox import processes

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade", "te"}
# Azure Storage's error codes for the statuses a fault answers with.
ERROR_CODES = {503: "ServerBusy", 500: "InternalError", 429: "TooManyRequests"}
LOG_LIMIT = 200_000  # requests a proxy remembers (snapshot()); the oldest are dropped


class Window:
    """A fault window on the monotonic clock: `open(seconds)` now, `active()` until it has passed."""

    def __init__(self) -> None:
        self._until = 0.0

    def open(self, seconds: float) -> None:
        self._until = time.monotonic() + seconds

    def close(self) -> None:
        self._until = 0.0

    def active(self) -> bool:
        return time.monotonic() < self._until


def error_body(status: int, table: bool) -> Tuple[bytes, str]:
    """(body, content type) of a Storage error answer: JSON for the table service, XML otherwise."""
    code = ERROR_CODES.get(status, "InternalError")
    message = f"Injected fault: {code}"
    if table:
        doc = {"odata.error": {"code": code, "message": {"lang": "en-US", "value": message}}}
        return json.dumps(doc).encode(), "application/json;odata=minimalmetadata"
    xml = (f'<?xml version="1.0" encoding="utf-8"?>'
           f"<Error><Code>{code}</Code><Message>{message}</Message></Error>")
    return xml.encode(), "application/xml"


class _ReusableTCPServer(ThreadingTCPServer):
    allow_reuse_address = True  # on this class: setting it on ThreadingTCPServer changed every user's


class _QuietServer(ThreadingHTTPServer):
    """A client that drops its keep-alive connection is no error worth a traceback on stderr."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


class HttpProxy:
    """Reverse proxy to `target_port` on loopback; `fail(status, seconds, retry_after)` opens a fault."""

    def __init__(self, target_port: int, table_service: bool = False) -> None:
        self.target_port = target_port
        self.table_service = table_service
        self.counts: Counter = Counter()  # every request, by (method, name): bench.fleet_scale's round trips
        self.log: Deque[Dict[str, Any]] = deque(maxlen=LOG_LIMIT)  # bounded: a 5-minute fault at full tilt
        self.lock = threading.Lock()
        self.window = Window()
        self.status = 503
        self.retry_after: Optional[int] = None
        self.faulted = 0  # requests answered with the fault's status
        self.server = _QuietServer((processes.LOOPBACK, 0), self._handler())
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="proxy", daemon=True)

    def start(self) -> HttpProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail(self, status: int, seconds: float, retry_after: Optional[int] = None) -> None:
        """Answer `status` (with `Retry-After: retry_after` when given) to every request for `seconds`."""
        with self.lock:
            self.status, self.retry_after = status, retry_after
            self.window.open(seconds)

    def snapshot(self) -> List[Dict[str, Any]]:
        with self.lock:
            return list(self.log)

    def _handler(self) -> type:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None  # read even when faulted: keep-alive
                path = self.path.split("?", 1)[0].strip("/").split("/")
                name = path[1] if len(path) > 1 else ""
                with proxy.lock:
                    faulted = proxy.window.active()
                    status, retry_after = proxy.status, proxy.retry_after
                    proxy.counts[(self.command, name)] += 1
                    proxy.faulted += faulted
                    proxy.log.append({"t": time.time(), "method": self.command, "queue": name,
                                      "path": self.path, "faulted": faulted})
                if faulted:
                    self._answer_fault(status, retry_after)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
                conn = http.client.HTTPConnection(processes.LOOPBACK, proxy.target_port, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status, resp.reason)
                    for key, value in resp.getheaders():
                        if key.lower() not in HOP_HEADERS and key.lower() != "content-length":
                            self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            def _answer_fault(self, status: int, retry_after: Optional[int]) -> None:
                data, kind = error_body(status, proxy.table_service)
                self.send_response(status)
                self.send_header("x-ms-error-code", ERROR_CODES.get(status, "InternalError"))
                self.send_header("Content-Type", kind)
                if retry_after is not None:
                    self.send_header("Retry-After", str(retry_after))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_MERGE = do_OPTIONS = do_PATCH = _forward

        return Handler


class StorageProxy:
    """One `HttpProxy` per Azurite service (blob, queue, table); `connection_string` points through them."""

    def __init__(self, azurite: processes.Server) -> None:
        self.services = {name: HttpProxy(port, table_service=name == "table")
                         for name, port in azurite.ports.items()}

    def start(self) -> StorageProxy:
        for proxy in self.services.values():
            proxy.start()
        return self

    def stop(self) -> None:
        for proxy in self.services.values():
            proxy.stop()

    @property
    def connection_string(self) -> str:
        ports = {name: proxy.port for name, proxy in self.services.items()}
        return processes.azurite_connection_string(ports["blob"], ports["queue"], ports["table"])

    def fail(self, status: int, seconds: float, retry_after: Optional[int] = None) -> None:
        for proxy in self.services.values():
            proxy.fail(status, seconds, retry_after)

    @property
    def faulted(self) -> int:
        return sum(proxy.faulted for proxy in self.services.values())


class TcpGate:
    """TCP relay to `target_port` on loopback; `cut(seconds)` makes the target unreachable for a while."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.window = Window()
        self.lock = threading.Lock()
        self.open_pairs: Set[Tuple[socket.socket, socket.socket]] = set()
        self.refused = 0  # connections closed on accept while cut
        gate = self

        class Relay(BaseRequestHandler):
            def handle(self) -> None:
                gate._relay(self.request)

        self.server = _ReusableTCPServer((processes.LOOPBACK, 0), Relay)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="tcp-gate", daemon=True)

    def start(self) -> TcpGate:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._close_all()

    def cut(self, seconds: float) -> None:
        """Drop every open connection; close new ones on accept until `seconds` have passed."""
        self.window.open(seconds)
        self._close_all()

    def restore(self) -> None:
        self.window.close()

    def _close_all(self) -> None:
        with self.lock:
            pairs, self.open_pairs = list(self.open_pairs), set()
        for pair in pairs:
            for sock in pair:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def _relay(self, client: socket.socket) -> None:
        if self.window.active():
            with self.lock:
                self.refused += 1
            return  # the handler's return closes the accepted socket
        try:
            upstream = socket.create_connection((processes.LOOPBACK, self.target_port), timeout=10)
        except OSError:
            return
        upstream.settimeout(None)
        pair = (client, upstream)
        with self.lock:
            self.open_pairs.add(pair)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join(timeout=5)
        with self.lock:
            self.open_pairs.discard(pair)
        upstream.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes until either side closes (or is closed by a cut)."""
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    for sock in (sink, source):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
