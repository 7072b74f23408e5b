"""A tiny local webhook receiver for alerts: prints each one and keeps them for inspection.

    python -m sandbox.webhook_receiver --port N [--fail-first K] [--fail-status 500] [--record FILE]

POST <any path>         an alert (JSON); answered 200, or --fail-status for the first K posts
GET  /alerts            every alert received so far, as [{"path", "body", "at"}]
DELETE /alerts          forget them
POST /admin/fail        {"count": K, "status": 500}: fail the next K posts
GET  /admin/health      {"ok": true}
Loopback only.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional

MAX_BODY = 1024 * 1024


class State:
    def __init__(self, fail_first: int, fail_status: int, record: Optional[Path]) -> None:
        self.alerts: List[Dict[str, Any]] = []
        self.fail_left = fail_first
        self.fail_status = fail_status
        self.attempts = 0
        self.record = record
        self.lock = threading.Lock()


def _summary(body: Any) -> str:
    if isinstance(body, dict):
        if "title" in body:
            return f"[{body.get('severity', '')}] {body['title']}: {body.get('text', '')}"
        if "text" in body:
            return str(body["text"])
        if "summary" in body:
            return str(body["summary"])
    return json.dumps(body)[:300]


def make_handler(state: State) -> type:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: the alerts are the output
            return

        def _send(self, status: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw or b"null")
            except ValueError:
                return raw.decode("utf-8", "replace")

        def do_GET(self) -> None:
            if self.path.startswith("/admin/health"):
                self._send(200, {"ok": True})
            elif self.path.startswith("/alerts"):
                with state.lock:
                    self._send(200, list(state.alerts))
            elif self.path.startswith("/admin/stats"):
                with state.lock:
                    self._send(200, {"attempts": state.attempts, "received": len(state.alerts)})
            else:
                self._send(404, {"error": "not found"})

        def do_DELETE(self) -> None:
            if self.path.startswith("/alerts"):
                with state.lock:
                    state.alerts.clear()
                    state.attempts = 0
                self._send(200, {"cleared": True})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = self._body()
            if self.path.startswith("/admin/fail"):
                with state.lock:
                    state.fail_left = int((body or {}).get("count", 1))
                    state.fail_status = int((body or {}).get("status", 500))
                self._send(201, {"failNext": state.fail_left})
                return
            with state.lock:
                state.attempts += 1
                if state.fail_left > 0:
                    state.fail_left -= 1
                    self._send(state.fail_status, {"error": "failing on purpose"})
                    return
                entry = {"path": self.path, "body": body, "at": time.time(),
                         "idempotencyKey": self.headers.get("Idempotency-Key")}
                state.alerts.append(entry)
                if state.record:
                    with state.record.open("a", encoding="utf-8") as fh:
                        fh.write(json.dumps(entry) + "\n")
            print(f"ALERT {_summary(body)}", flush=True)
            self._send(200, {"ok": True})

    return Handler


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--fail-first", type=int, default=0, help="answer the first K alerts with --fail-status"
    )
    parser.add_argument("--fail-status", type=int, default=500)
    parser.add_argument("--record", type=Path, help="append every alert to this JSON-lines file")
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(
        ("127.0.0.1", args.port), make_handler(State(args.fail_first, args.fail_status, args.record))
    )
    print(f"webhook receiver on http://127.0.0.1:{args.port}/", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
