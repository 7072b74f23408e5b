"""HTTP for IMDS on the standard library's `http.client`: one exchange at a time over kept-alive
connections, each bounded by a connect and a read timeout and a body cap.

Why not requests (which the token client and the Azure SDKs keep using): at 1 Hz, requests and urllib3
cost about 1 ms of CPU per call more than http.client for the same exchange, 3.6 of the forwarder's
8 CPU-seconds an hour when idle (bench forwarder_footprint: the two reference pollers, same run). What
requests adds is what IMDS forbids anyway: http.client never reads proxy settings, never follows a
redirect and keeps no cookies, so IMDS is never proxied by construction, not by configuration.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlencode, urlsplit

# A reused keep-alive connection the server closed meanwhile fails like this before any answer; the
# exchange is then sent once more on a new connection (IMDS GETs and approvals are both idempotent).
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
MAX_IDLE_CONNECTIONS = 4  # the poller, the approval reader and a fast-path thread at most, at once
# A connection idle longer is closed at the next exchange: the pool keeps what is in use (the poller's, at
# 1 Hz), not what a rare moment of several threads at once opened (the 30-day soak: an IMDS connection
# more for good after day 10, an open file the soak's rule counts as added).
IDLE_SECONDS = 30.0


def _kind(exc: BaseException) -> str:
    """The words the logs and the heartbeat's lastError have always used for these faults."""
    if isinstance(exc, (TimeoutError, socket.timeout)):  # one class since 3.10; the VM may run 3.9
        return "Timeout"
    return "ConnectionError" if isinstance(exc, OSError) else "BadAnswer"


class TransportError(Exception):
    """No HTTP answer: refused, reset, timed out, or not HTTP."""


class BodyTooLarge(Exception):
    """The answer's body is larger than the cap; it was not read (the connection is dropped)."""

    def __init__(self, status: int, what: str) -> None:
        super().__init__(what)
        self.status = status


@dataclass
class Answer:
    status: int
    headers: Dict[str, str]
    text: str


class ImdsHttp:
    """Exchanges with one `http://host[:port][/prefix]` base; safe to share between threads."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"IMDS is plain http://host[:port][/path]; got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._idle: List[Tuple[http.client.HTTPConnection, float]] = []  # (connection, when given back)
        self._lock = threading.Lock()

    def exchange(self, method: str, path: str, query: Dict[str, str], headers: Dict[str, str],
                 body: Optional[bytes], connect_timeout: float, read_timeout: float,
                 max_body: int) -> Answer:
        target = f"{self.prefix}{path}{'&' if '?' in path else '?'}{urlencode(query)}"
        send_headers = dict(headers)
        if body is not None:
            send_headers["Content-Type"] = "application/json"
        conn, reused = self._take(connect_timeout)
        try:
            try:
                return self._once(conn, method, target, send_headers, body, read_timeout, max_body)
            except _STALE:
                if not reused:
                    raise
                conn.close()
                conn = self._new(connect_timeout)
                return self._once(conn, method, target, send_headers, body, read_timeout, max_body)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TransportError(f"{_kind(exc)} ({type(exc).__name__}: {exc})") from exc
        except BaseException:
            conn.close()
            raise

    def _once(self, conn: http.client.HTTPConnection, method: str, target: str, headers: Dict[str, str],
              body: Optional[bytes], read_timeout: float, max_body: int) -> Answer:
        if conn.sock is None:
            conn.connect()  # with the connect timeout the connection was made with
        conn.sock.settimeout(read_timeout)
        conn.request(method, target, body=body, headers=headers)
        response = conn.getresponse()
        declared = response.getheader("Content-Length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > max_body:
            raise BodyTooLarge(response.status, f"Content-Length {declared}")
        data = response.read(max_body + 1)
        if len(data) > max_body:
            raise BodyTooLarge(response.status, f"more than {max_body} bytes sent")
        answer = Answer(status=response.status, headers=dict(response.getheaders()),
                        text=data.decode(response.msg.get_content_charset() or "utf-8", errors="replace"))
        if response.isclosed() and not response.will_close:
            self._give_back(conn)
        else:
            conn.close()
        return answer

    def _new(self, connect_timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=connect_timeout)

    def _take(self, connect_timeout: float) -> Tuple[http.client.HTTPConnection, bool]:
        """The connection given back last (LIFO: the busiest stays warm, the others age out)."""
        oldest = time.monotonic() - IDLE_SECONDS
        with self._lock:
            stale = [conn for conn, at in self._idle if at < oldest]
            self._idle = [(conn, at) for conn, at in self._idle if at >= oldest]
            taken = self._idle.pop()[0] if self._idle else None
        for conn in stale:
            conn.close()
        if taken is not None:
            return taken, True
        return self._new(connect_timeout), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()

