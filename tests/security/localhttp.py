"""A tiny loopback HTTP server in a thread, for answers no real stand-in gives on purpose:
redirects, endless bodies, and a proxy that records what reaches it."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Iterator, List, Optional

from sandbox import processes

Handler = Callable[[BaseHTTPRequestHandler], None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    seen: List[str]
    answer: Handler


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _any(self) -> None:
        self.server.seen.append(f"{self.command} {self.path}")
        try:
            self.server.answer(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading: what the size tests want

    do_GET = do_POST = do_PUT = do_CONNECT = do_HEAD = _any

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve(answer: Handler) -> Iterator[_Server]:
    """Serve `answer(handler)` for every request on 127.0.0.1; `.seen` lists "METHOD path"."""
    server = _Server((processes.LOOPBACK, 0), _Handler)
    server.seen, server.answer = [], answer
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def url(server: _Server) -> str:
    return f"http://{processes.LOOPBACK}:{server.server_address[1]}"


def reply(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"",
          headers: Optional[Dict[str, str]] = None) -> None:
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def stream(handler: BaseHTTPRequestHandler, total: int, declare_length: bool,
           chunk: bytes = b"[" + b"1," * 32767 + b"1") -> int:
    """Send a 200 JSON-looking body of `total` bytes in 64 KiB pieces (never held whole in memory).
    Returns the bytes actually written before the client hung up."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json; charset=utf-8")
    if declare_length:
        handler.send_header("Content-Length", str(total))
    else:
        handler.send_header("Connection", "close")
    handler.end_headers()
    sent = 0
    while sent < total:
        piece = chunk[: total - sent]
        handler.wfile.write(piece)
        sent += len(piece)
    return sent
