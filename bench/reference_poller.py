"""A minimal Scheduled Events poller: the yardstick bench/forwarder_footprint.py holds the forwarder to.

    python -m bench.reference_poller --url http://127.0.0.1:N/vms/vm1 --state DIR [--http requests]

The same job, the least code: GET the document once a second (Metadata: true, no proxy, If-None-Match
with the last ETag as Microsoft's samples do), parse and validate a changed one with a jsonschema
validator built once (schemas/imds-scheduled-events.schema.json), and keep it in a SQLite outbox
(WAL, synchronous=FULL: fsync per change) with the last state, marked sent at once (no sink). No
retries beyond the next second, no heartbeats, no approvals: a floor, not a product. `--http` picks
the client: `http.client` (the standard library, the default) or `requests` (what the forwarder uses).
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

Fetch = Callable[[Optional[str]], Tuple[int, bytes, Optional[str]]]  # etag -> (status, body, etag)


def http_client_fetch(url: str) -> Fetch:
    import http.client

    parts = urlsplit(url)
    path = f"{parts.path}/metadata/scheduledevents?api-version=2020-07-01"
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=5)

    def fetch(etag: Optional[str]) -> Tuple[int, bytes, Optional[str]]:
        headers = {"Metadata": "true", **({"If-None-Match": etag} if etag else {})}
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read(), resp.getheader("ETag")
        except (OSError, http.client.HTTPException):
            conn.close()  # reconnects on the next request
            return 0, b"", None

    return fetch


def requests_fetch(url: str) -> Fetch:
    import requests

    session = requests.Session()
    session.trust_env = False  # never through a proxy
    target = f"{url.rstrip('/')}/metadata/scheduledevents"

    def fetch(etag: Optional[str]) -> Tuple[int, bytes, Optional[str]]:
        headers = {"Metadata": "true", **({"If-None-Match": etag} if etag else {})}
        try:
            resp = session.get(target, params={"api-version": "2020-07-01"}, headers=headers, timeout=5,
                               allow_redirects=False)
            return resp.status_code, resp.content, resp.headers.get("ETag")
        except requests.RequestException:
            return 0, b"", None

    return fetch


def open_outbox(state: Path) -> sqlite3.Connection:
    state.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(state / "reference.sqlite3"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, body TEXT, sent INTEGER)")
    db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT)")
    return db


def run(url: str, state: Path, client: str, seconds: float, stop: threading.Event) -> int:
    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[1] / "schemas" /
                         "imds-scheduled-events.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)  # built once
    fetch = http_client_fetch(url) if client == "http.client" else requests_fetch(url)
    db = open_outbox(state)
    etag: Optional[str] = None
    last: Optional[int] = None
    changes = 0
    end = time.monotonic() + seconds if seconds else None
    next_at = time.monotonic()
    while not stop.is_set() and (end is None or time.monotonic() < end):
        status, body, new_etag = fetch(etag)
        if status == 200:
            etag = new_etag
            document: Dict[str, Any] = json.loads(body)
            errors: List[str] = [e.message for e in validator.iter_errors(document)]
            incarnation = document.get("DocumentIncarnation")
            if errors or incarnation != last:
                db.execute("BEGIN IMMEDIATE")
                cur = db.execute("INSERT INTO outbox(body, sent) VALUES (?, 0)", (body.decode(),))
                db.execute("INSERT OR REPLACE INTO state VALUES ('last', ?)", (json.dumps(incarnation),))
                db.execute("COMMIT")
                db.execute("UPDATE outbox SET sent = 1 WHERE seq = ?", (cur.lastrowid,))  # "published"
                last, changes = incarnation, changes + 1
        next_at += 1.0
        stop.wait(max(0.0, next_at - time.monotonic()))
    db.close()
    print(json.dumps({"changes": changes, "last": last}), flush=True)
    return 0


def poller_main(argv: List[str]) -> int:  # not `main`: `python -m bench` runs every module with one
    parser = argparse.ArgumentParser(prog="python -m bench.reference_poller", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="IMDS base URL (sandbox: http://127.0.0.1:N/vms/<vm>)")
    parser.add_argument("--state", required=True, type=Path, help="directory of the SQLite outbox")
    parser.add_argument("--http", choices=("http.client", "requests"), default="http.client")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after S seconds (0: at SIGTERM)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return run(args.url, args.state, args.http, args.seconds, stop)


if __name__ == "__main__":
    sys.exit(poller_main(sys.argv[1:]))
