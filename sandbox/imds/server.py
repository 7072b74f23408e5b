"""HTTP plumbing: one ThreadingHTTPServer on loopback routing /metadata, /vms/<name>/metadata, /admin."""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Sequence, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit

from .admin import AdminApi
from .arm import ArmStandIn
from .attested import AttestedDocuments
from .ca_change import CaChange
from .clock import Clock
from .fabric import Fabric, UnknownVm
from .faults import FaultBook
from .identity import Identity
from .metadata import MetadataService, Request
from .ratelimit import SlidingWindowLimiter
from .requestlog import Entry, RequestLog
from .resource_graph import ResourceGraphStandIn
from .responses import Response, error

MAX_BODY = 1024 * 1024


@dataclass
class Simulator:
    fabric: Fabric
    faults: FaultBook
    limiter: SlidingWindowLimiter
    log: RequestLog
    metadata: MetadataService
    admin: AdminApi
    verbose: bool = False
    arm: Optional[ArmStandIn] = None  # the ARM acknowledge API's stand-in (/subscriptions/...)
    ca: Optional[CaChange] = None  # the CA-change drill (/admin/attestation, /aia/)
    graph: Optional[ResourceGraphStandIn] = None  # Resource Graph's stand-in (/providers/...ResourceGraph)


def build(identities: Sequence[Identity], time_scale: float = 1.0, rate_limit: int = 5,
          rate_window: float = 1.0, first_call_delay: float = 0.0, verbose: bool = False,
          attestation: Optional[AttestedDocuments] = None) -> Simulator:
    fabric = Fabric(Clock(time_scale), identities)
    faults, log = FaultBook(), RequestLog()
    limiter = SlidingWindowLimiter(rate_limit, rate_window)
    metadata = MetadataService(fabric, faults, limiter, first_call_delay)
    metadata.attested = attestation  # None: the attested route answers 404
    return Simulator(fabric, faults, limiter, log, metadata, AdminApi(fabric, faults, limiter, log), verbose,
                     ArmStandIn(fabric), CaChange(attestation) if attestation is not None else None,
                     ResourceGraphStandIn(fabric))


def split_vm(path: str, sim: Simulator) -> Tuple[str, str]:
    """('vm name', path without the /vms/<name> prefix). Plain /metadata is the first VM."""
    if path.startswith("/vms/"):
        name, _, rest = path[len("/vms/"):].partition("/")
        return unquote(name), "/" + rest
    return sim.fabric.first_vm(), path


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like IMDS (see _send)
    server_version = "IMDS-sandbox"
    sim: Simulator  # set on the subclass built by serve()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        body = self._read_body()
        if body is None:
            return  # answered (400/411/413) and the connection marked to close
        try:
            response = self._route(body)
        except Exception as exc:  # noqa: BLE001 - a simulator bug must answer 500, not kill the connection
            traceback.print_exc(file=sys.stderr)
            response = error(500, f"simulator error: {type(exc).__name__}: {exc}")
        self._send(response)

    def _read_body(self) -> Optional[bytes]:
        """The request body (Content-Length or chunked), or None after answering a body we cannot read
        safely; then the connection is closed, since the rest of it cannot be told from the next request."""
        coding = (self.headers.get("Transfer-Encoding") or "").strip().lower()
        if coding:
            if coding != "chunked":
                return self._refuse(501, f"Transfer-Encoding {coding!r} is not supported (only chunked)")
            return self._read_chunked()
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        if not raw.strip().isdigit():
            return self._refuse(400, "bad Content-Length")
        length = int(raw)
        if length > MAX_BODY:
            return self._refuse(413, f"request body over {MAX_BODY} bytes")
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> Optional[bytes]:
        chunks: List[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1026)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                return self._refuse(400, "bad chunk size line")
            if size == 0:
                while self.rfile.readline(8194).strip():  # trailers, up to the blank line
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_BODY:
                return self._refuse(413, f"request body over {MAX_BODY} bytes")
            chunks.append(self.rfile.read(size))
            if self.rfile.read(2) != b"\r\n":
                return self._refuse(400, "chunk not followed by CRLF")

    def _refuse(self, status: int, message: str) -> None:
        self.close_connection = True
        self._send(error(status, message))
        return None

    def _route(self, body: bytes) -> Response:
        url = urlsplit(self.path)
        query: Dict[str, str] = {}
        for key, value in parse_qsl(url.query, keep_blank_values=True):
            query.setdefault(key, value)
        if self.sim.arm is not None and url.path.lower().startswith("/subscriptions/"):
            return self.sim.arm.handle(self.command, url.path, query, self.headers, body)
        if self.sim.graph is not None and url.path.lower().startswith("/providers/microsoft.resourcegraph/"):
            return self.sim.graph.handle(self.command, url.path, query, self.headers, body)
        if self.sim.arm is not None and url.path == "/admin/arm" and self.command == "POST":
            try:
                return self.sim.arm.configure(json.loads(body or b"{}"))
            except ValueError:
                return error(400, "the body must be JSON")
        if self.sim.arm is not None and url.path == "/admin/arm" and self.command == "GET":
            return self.sim.arm.status()
        if self.sim.ca is not None and url.path.startswith("/aia/") and self.command == "GET":
            return self.sim.ca.certificate(url.path)
        if self.sim.ca is not None and url.path.split("/")[1:3] == ["admin", "attestation"]:
            try:
                payload = json.loads(body or b"{}")
            except ValueError:
                return error(400, "the body must be JSON")
            host, port = self.server.server_address[:2]
            rest = [unquote(p) for p in url.path.split("/")[3:] if p]
            return self.sim.ca.handle(self.command, rest, payload, f"http://{host}:{port}")
        if url.path == "/admin" or url.path.startswith("/admin/"):
            parts: List[str] = [unquote(p) for p in url.path[len("/admin/"):].split("/") if p]
            return self.sim.admin.handle(self.command, parts, query, body)
        vm, path = split_vm(url.path, self.sim)
        entry = Entry(t=time.time(), vm=vm, method=self.command, path=path, query=query,
                      headers=dict(self.headers.items()), body=body.decode("utf-8", "replace"))
        try:
            if not path.startswith("/metadata"):
                response = error(404, "Not found")
            else:
                request = Request(vm, self.command, path, query, self.headers, body)
                response = self.sim.metadata.handle(request)
        except UnknownVm:
            response = error(404, f"Not found (no simulated VM {vm!r})")
        entry.status = response.status
        self.sim.log.add(entry)  # before answering: a client that got its answer finds it logged
        return response

    def _send(self, response: Response) -> None:
        """HTTP/1.1 as a real server answers: a length on every answer that has a body (none on 304,
        which never has one), and `Connection: close` whenever this connection ends after the answer
        (the client asked for it, or its request could not be read), so a client that keeps
        connections alive never writes its next request into a socket being closed."""
        self.send_response(response.status)
        for key, value in response.headers.items():
            self.send_header(key, value)
        if response.status != 304 and not 100 <= response.status < 200:
            self.send_header("Content-Length", str(len(response.body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if response.body and self.command != "HEAD" and response.status != 304:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: object) -> None:
        if self.sim.verbose:
            sys.stderr.write(f"imds {self.address_string()} {format % args}\n")


def serve(sim: Simulator, host: str, port: int) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"sim": sim})
    httpd = ThreadingHTTPServer((host, port), handler)
    httpd.daemon_threads = True
    return httpd


def run_forever(sim: Simulator, httpd: ThreadingHTTPServer) -> None:
    clock = sim.fabric.start_clock()
    try:
        httpd.serve_forever(poll_interval=0.5)
    finally:
        sim.fabric.stop()
        clock.join(timeout=5)
        httpd.server_close()


def serve_in_thread(sim: Simulator, httpd: ThreadingHTTPServer) -> threading.Thread:
    """For embedding (demo scripts): serve on a daemon thread; stop with httpd.shutdown()."""
    thread = threading.Thread(target=run_forever, args=(sim, httpd), name="imds-http", daemon=True)
    thread.start()
    return thread
