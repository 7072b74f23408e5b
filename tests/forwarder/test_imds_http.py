"""forwarder/imds_http.py against a loopback HTTP/1.1 server: kept-alive connections are reused, a
connection the server dropped while idle costs one resend (not a failed poll), and the query joins a
path that has one."""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler
from typing import Callable, List

import pytest

from forwarder.imds import ImdsClient
from forwarder.imds_http import ImdsHttp, TransportError
from sandbox import processes
from tests.security import localhttp

BODY = b'{"DocumentIncarnation": 1, "Events": []}'


def _answer(ports: List[int], keep_alive: bool) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.protocol_version = "HTTP/1.1"  # the client may keep the connection
        ports.append(handler.client_address[1])
        localhttp.reply(handler, 200, BODY, {"Content-Type": "application/json"})
        # A server dropping an idle keep-alive connection without saying so (no "Connection: close"):
        handler.close_connection = not keep_alive
    return answer


def test_one_connection_serves_successive_polls() -> None:
    ports: List[int] = []
    with localhttp.serve(_answer(ports, keep_alive=True)) as server:
        client = ImdsClient(localhttp.url(server))
        try:
            for _ in range(3):
                assert client.get_scheduled_events().json()["DocumentIncarnation"] == 1
        finally:
            client.close()
    assert len(ports) == 3 and len(set(ports)) == 1, ports  # one TCP connection for all three


def test_a_connection_dropped_while_idle_costs_a_resend_not_a_failure() -> None:
    ports: List[int] = []
    with localhttp.serve(_answer(ports, keep_alive=False)) as server:
        client = ImdsClient(localhttp.url(server))
        try:
            for _ in range(3):
                assert client.get_scheduled_events().attempts == 1
        finally:
            client.close()
        assert client.health.failures == 0 and client.health.retries == 0
    assert len(ports) == 3 and len(set(ports)) == 3, ports  # a new connection each time


def test_connections_opened_at_once_age_out_and_the_busy_one_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three threads at once open three connections; then one thread polls: it reuses one of them, and the
    two it does not use are closed once idle for IDLE_SECONDS (seen by the kernel: their sockets end)."""
    import threading

    from forwarder import imds_http

    monkeypatch.setattr(imds_http, "IDLE_SECONDS", 1.5)  # the client's rate limit spaces its calls too
    ports: List[int] = []
    gate = threading.Barrier(3)

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.protocol_version = "HTTP/1.1"
        ports.append(handler.client_address[1])
        if len(ports) <= 3:
            gate.wait(timeout=10)  # the first three are answered together: three connections
        localhttp.reply(handler, 200, BODY, {"Content-Type": "application/json"})
        handler.close_connection = False  # kept alive, as IMDS keeps it

    with localhttp.serve(answer) as server:
        client = ImdsClient(localhttp.url(server))
        try:
            threads = [threading.Thread(target=client.get_scheduled_events) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=20)
            assert len(set(ports)) == 3
            open_before = _established(server.server_address[1])
            for _ in range(8):  # one thread polling every 0.3 s for 2.4 s: one connection stays busy
                client.get_scheduled_events()
                time.sleep(0.3)
            assert set(ports[3:]) == {ports[3]} and ports[3] in ports[:3]  # one kept connection served them
            deadline = time.monotonic() + 5
            while _established(server.server_address[1]) != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert open_before == 3 and _established(server.server_address[1]) == 1
        finally:
            client.close()


def _established(port: int) -> int:
    """This process's TCP connections to `port` still open (psutil: the kernel's view, not the pool's)."""
    import psutil

    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_the_query_joins_a_path_that_has_one() -> None:
    with localhttp.serve(lambda h: localhttp.reply(h, 200, BODY)) as server:
        http = ImdsHttp(localhttp.url(server) + "/vms/vm0")
        try:
            answer = http.exchange("GET", "/metadata/attested/document?nonce=12",
                                   {"api-version": "2021-02-01"}, {"Metadata": "true"}, None, 3.0, 5.0, 1024)
        finally:
            http.close()
        assert answer.status == 200
        assert server.seen == ["GET /vms/vm0/metadata/attested/document?nonce=12&api-version=2021-02-01"]


def test_no_listener_is_a_connection_error() -> None:
    http = ImdsHttp(f"http://{processes.LOOPBACK}:{processes.free_port()}")
    with pytest.raises(TransportError, match=r"^ConnectionError"):
        http.exchange("GET", "/x", {}, {}, None, 1.0, 1.0, 10)


@pytest.mark.parametrize("base", ["https://169.254.169.254", "169.254.169.254", "http:///path"])
def test_only_plain_http_bases(base: str) -> None:
    with pytest.raises(ValueError, match="plain http"):
        ImdsHttp(base)
