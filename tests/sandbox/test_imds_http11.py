"""IMDS simulator conformance, HTTP/1.1 itself: persistent connections, Connection: close, chunked request
bodies, conditional GETs (If-None-Match lists, W/, *), 304 without a body length. Real clients that keep
connections alive: http.client on one socket, and Node's http agent with keepAlive (what node-fetch 2 in
Microsoft's Node sample uses) when node is installed."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest

from sandbox import processes
from sandbox.imds.client import ImdsSimulator
from sandbox.imds.metadata import etag_matches
from tests.sandbox.simulator import running

SE = "/metadata/scheduledevents?api-version=2020-07-01"
HEADERS = {"Metadata": "true"}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImdsSimulator]:
    yield from running(["--rate-limit", "0", "--vm", "vm0"], tmp_path_factory.mktemp("imds"))


@pytest.fixture(autouse=True)
def _fresh(sim: ImdsSimulator) -> None:
    sim.reset()


def _port(sim: ImdsSimulator) -> int:
    return int(sim.base_url.rsplit(":", 1)[1])


Answer = Tuple[int, bytes, http.client.HTTPResponse]


def _get(conn: http.client.HTTPConnection, headers: Dict[str, str]) -> Answer:
    conn.request("GET", SE, headers={**HEADERS, **headers})
    resp = conn.getresponse()
    return resp.status, resp.read(), resp


def test_one_kept_alive_connection_serves_get_304_and_the_approval_post(sim: ImdsSimulator) -> None:
    """The sample's sequence on one socket: GET, GET If-None-Match (304), POST StartRequests, GET."""
    event_id = sim.add_event(eventType="Reboot", resources=["vm0"])["eventId"]
    conn = http.client.HTTPConnection(processes.LOOPBACK, _port(sim), timeout=10)
    status, body, resp = _get(conn, {})
    etag = resp.getheader("ETag")
    assert status == 200 and etag and resp.getheader("Connection") is None
    sock = conn.sock
    status, body, resp = _get(conn, {"If-None-Match": etag})
    assert status == 304 and body == b"" and resp.getheader("Content-Length") is None
    assert resp.getheader("ETag") == etag
    conn.request("POST", SE, body=json.dumps({"StartRequests": [{"EventId": event_id}]}),
                 headers={**HEADERS, "Content-Type": "application/json"})
    post = conn.getresponse()
    assert post.status == 200 and post.read() == b""
    status, body, _ = _get(conn, {"If-None-Match": etag})
    assert status == 200 and json.loads(body)["Events"][0]["EventStatus"] == "Started"
    assert conn.sock is sock, "every answer kept the connection open"
    conn.close()


@pytest.mark.parametrize("header", ['W/"{e}"', '"x", "{e}"', '"x",W/"{e}" , "y"', "*"])
def test_if_none_match_lists_weak_tags_and_star(sim: ImdsSimulator, header: str) -> None:
    conn = http.client.HTTPConnection(processes.LOOPBACK, _port(sim), timeout=10)
    _, _, first = _get(conn, {})
    etag = first.getheader("ETag").strip('"')
    status, body, _ = _get(conn, {"If-None-Match": header.format(e=etag)})
    assert status == 304 and body == b""
    status, _, _ = _get(conn, {"If-None-Match": '"something-else"'})
    assert status == 200
    conn.close()


def test_etag_matching_rules() -> None:
    assert etag_matches('"a"', '"a"') and etag_matches('W/"a"', '"a"') and etag_matches('"b", "a"', '"a"')
    assert etag_matches("*", '"a"') and not etag_matches('"b"', '"a"') and not etag_matches("", '"a"')
    assert not etag_matches(None, '"a"')


def test_chunked_request_body_is_read(sim: ImdsSimulator) -> None:
    event_id = sim.add_event(eventType="Reboot", resources=["vm0"])["eventId"]
    payload = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
    conn = http.client.HTTPConnection(processes.LOOPBACK, _port(sim), timeout=10)
    conn.request("POST", SE, body=iter([payload[:10], payload[10:]]), headers=HEADERS, encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b""
    status, body, _ = _get(conn, {})  # the same connection: the chunked body was consumed exactly
    assert status == 200 and json.loads(body)["Events"][0]["EventStatus"] == "Started"
    conn.close()


def _raw(sim: ImdsSimulator, request: bytes) -> bytes:
    with socket.create_connection((processes.LOOPBACK, _port(sim)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                return b"".join(chunks)  # the server closed the connection
            chunks.append(data)


def test_a_body_that_cannot_be_read_is_answered_with_connection_close(sim: ImdsSimulator) -> None:
    bad_length = _raw(sim, b"POST /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\n"
                           b"Metadata: true\r\nContent-Length: nope\r\n\r\n")
    assert bad_length.startswith(b"HTTP/1.1 400") and b"\r\nConnection: close\r\n" in bad_length
    bad_chunk = _raw(sim, b"POST /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\n"
                          b"Metadata: true\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    assert bad_chunk.startswith(b"HTTP/1.1 400") and b"\r\nConnection: close\r\n" in bad_chunk
    gzip = _raw(sim, b"POST /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\n"
                     b"Metadata: true\r\nTransfer-Encoding: gzip\r\n\r\n")
    assert gzip.startswith(b"HTTP/1.1 501") and b"\r\nConnection: close\r\n" in gzip


def test_a_client_asking_to_close_gets_connection_close(sim: ImdsSimulator) -> None:
    answer = _raw(sim, b"GET /metadata/scheduledevents?api-version=2020-07-01 HTTP/1.1\r\nHost: x\r\n"
                       b"Metadata: true\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and b"\r\nConnection: close\r\n" in answer


NODE_CLIENT = r"""
const http = require('http');
const [port, eventId] = process.argv.slice(2);
const agent = new http.Agent({keepAlive: true, maxSockets: 1});
const sockets = new Set();
function call(method, headers, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({host: '127.0.0.1', port, agent, method,
      path: '/metadata/scheduledevents?api-version=2020-07-01', headers: {Metadata: 'true', ...headers}},
      (res) => { let data = ''; res.on('data', (c) => data += c);
                 res.on('end', () => resolve({status: res.statusCode, etag: res.headers.etag, data})); });
    req.on('socket', (s) => sockets.add(s));
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}
(async () => {
  const out = [];
  const first = await call('GET', {});
  out.push(first.status);
  out.push((await call('GET', {'If-None-Match': first.etag})).status);
  const body = JSON.stringify({StartRequests: [{EventId: eventId}]});
  const type = {'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body)};
  out.push((await call('POST', type, body)).status);
  out.push((await call('GET', {'If-None-Match': first.etag})).status);
  console.log(JSON.stringify({statuses: out, sockets: sockets.size}));
  agent.destroy();
})().catch((e) => { console.log(JSON.stringify({error: String(e)})); process.exit(1); });
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_nodes_keep_alive_agent_gets_every_answer_on_one_socket(sim: ImdsSimulator, tmp_path: Path) -> None:
    """Node's keep-alive agent (node-fetch 2 uses one): the approval POST after a 304 on a reused socket
    answers 200, no 'socket hang up'."""
    event_id = sim.add_event(eventType="Reboot", resources=["vm0"])["eventId"]
    script = tmp_path / "client.js"
    script.write_text(NODE_CLIENT)
    done = subprocess.run(["node", str(script), str(_port(sim)), event_id], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == {"statuses": [200, 304, 200, 200], "sockets": 1}
