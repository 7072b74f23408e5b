"""Azure Resource Graph's stand-in for `se-fleet coverage` (issue 48): the fleet's VMs, scale sets and their
instances, availability sets, the forwarder's extensions and central's role assignments, as the coverage
queries (central/policy/coverage.py) project them, from a "world" a test or the demo writes.

  POST /providers/Microsoft.ResourceGraph/resources?api-version=2022-10-01
       {subscriptions? | managementGroups?, query, options: {$top, $skipToken, resultFormat}}
       -> 200 {totalRecords, count, resultTruncated, $skipToken?, data: [rows], facets: []}
  POST /admin/world {resources, computeresources, authorizationresources, managementGroups}: replace it
  GET  /admin/calls: the requests answered so far (each with its caller's User-Agent, `userAgent`)
  POST /admin/throttle {queries, resetsAfter}: the next `queries` queries are answered 429 RateLimiting with
       Resource Graph's throttling headers (x-ms-user-quota-remaining: 0, x-ms-user-quota-resets-after:
       `resetsAfter`, hh:mm:ss), as Azure throttles a principal past its quota

It is not a KQL engine: it recognizes the coverage queries by their table (`resources ... | union
(computeresources ...`, `authorizationresources`) and applies what they filter on (subscriptions or
management groups, `resourceGroup =~ "..."`, central's principal id); another query is a 400, as an
unsupported one would be. Rows are stored as those queries project them (authorizationresources rows also
carry principalId, which the query filters on and does not project). A Bearer token for ARM is required
(checked as sandbox/imds/arm.py does); a subscription or management group the world does not know is
refused 403 AuthorizationFailed. Pages: at most $top rows (1000 by default and at most); the skip token is
opaque to the client (the next offset).

  python -m sandbox.inventory_graph --port 8090 [--world world.json]
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import parse_qsl, urlsplit

from sandbox.imds.arm import arm_token_problem
from sandbox.imds.resource_graph import PATH, VERSIONS, page

TABLES = ("resources", "computeresources", "authorizationresources")
_GROUP = re.compile(r'resourceGroup\s*=~\s*"([^"]+)"')
_PRINCIPAL = re.compile(r'properties\.principalId\)\s*=~\s*"([^"]+)"')


def _error(status: int, code: str, message: str) -> Tuple[int, Dict[str, Any]]:
    return status, {"error": {"code": code, "message": message}}


class World:
    def __init__(self, world: Optional[Mapping[str, Any]] = None) -> None:
        self.lock = threading.Lock()
        self.calls: List[Dict[str, Any]] = []
        self.throttled, self.resets_after = 0, "00:00:01"  # queries still to answer 429, and the header
        self.replace(world or {})

    def take_throttle(self) -> bool:
        """This query is one of those to throttle (counted down)."""
        with self.lock:
            if self.throttled <= 0:
                return False
            self.throttled -= 1
            return True

    def replace(self, world: Mapping[str, Any]) -> None:
        with self.lock:
            self.tables = {t: list(world.get(t, [])) for t in TABLES}
            groups = world.get("managementGroups", {})
            self.groups = {k.lower(): [s.lower() for s in v] for k, v in groups.items()}

    def known_subscriptions(self) -> set:
        return {str(r.get("subscriptionId", "")).lower() for t in TABLES for r in self.tables[t]} | \
            {s for subs in self.groups.values() for s in subs}

    def rows(self, query: str) -> Optional[List[Dict[str, Any]]]:
        text = query.strip()
        if text.startswith("authorizationresources"):
            principal = _PRINCIPAL.search(text)
            rows = [{"id": r["id"], "scope": r["scope"], "subscriptionId": r.get("subscriptionId", "")}
                    for r in self.tables["authorizationresources"]
                    if principal and str(r.get("principalId", "")).lower() == principal.group(1).lower()]
        elif text.startswith("resources") and "union (computeresources" in text:
            rows = self.tables["resources"] + self.tables["computeresources"]
            group = _GROUP.search(text)
            if group:
                rows = [r for r in rows if str(r.get("resourceGroup", "")).lower() == group.group(1).lower()]
        else:
            return None
        return sorted(rows, key=lambda r: str(r.get("id", "")).lower())

    def answer(self, request: Mapping[str, Any], user_agent: str = "") -> Tuple[int, Dict[str, Any]]:
        with self.lock:
            self.calls.append({**request, "userAgent": user_agent})
            rows = self.rows(str(request.get("query", "")))
            if rows is None:
                return _error(400, "BadRequest", "the stand-in answers only the coverage queries "
                                                 "(central/policy/coverage.py)")
            known = self.known_subscriptions()
            asked = [str(s).lower() for s in request.get("subscriptions") or []]
            for group in request.get("managementGroups") or []:
                if str(group).lower() not in self.groups:
                    return _error(403, "AuthorizationFailed", f"no access to management group {group}")
                asked += self.groups[str(group).lower()]
            unknown = [s for s in asked if s not in known]
            if unknown:
                return _error(403, "AuthorizationFailed", f"the client has no access to subscription(s) "
                                                          f"{', '.join(unknown)}")
            if asked:
                rows = [r for r in rows if str(r.get("subscriptionId", "")).lower() in asked]
        answer = page(rows, request.get("options") or {})
        if answer is None:
            return _error(400, "BadRequest", "the $skipToken is not one this service gave")
        return 200, answer


def handler(world: World) -> type:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet: tests read answers, not logs
            pass

        def _send(self, status: int, body: Any, headers: Optional[Mapping[str, str]] = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if urlsplit(self.path).path == "/admin/calls":
                with world.lock:
                    self._send(200, world.calls)
            else:
                self._send(*_error(404, "NotFound", f"no route GET {self.path}"))

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._send(*_error(400, "BadRequest", "the body must be JSON"))
                return
            if url.path == "/admin/world":
                world.replace(body)
                self._send(200, {"ok": True})
                return
            if url.path == "/admin/throttle":
                with world.lock:
                    world.throttled = int(body.get("queries", 1))
                    world.resets_after = str(body.get("resetsAfter", "00:00:01"))
                self._send(200, {"ok": True})
                return
            if url.path.rstrip("/").lower() != PATH:
                self._send(*_error(404, "NotFound", f"no Resource Graph route POST {url.path}"))
                return
            problem = arm_token_problem(self.headers.get("Authorization") or "")
            if problem:
                self._send(*_error(401, "AuthenticationFailed", problem))
                return
            version = dict(parse_qsl(url.query)).get("api-version")
            if version not in VERSIONS:
                self._send(*_error(400, "InvalidApiVersionParameter",
                                   f"api-version {version!r}: one of {', '.join(VERSIONS)}"))
                return
            agent = self.headers.get("User-Agent") or ""
            if world.take_throttle():
                self._send(*_error(429, "RateLimiting", "Please provide below info when asking for support: "
                                                        "the client is throttled (stand-in)"),
                           headers={"x-ms-user-quota-remaining": "0",
                                    "x-ms-user-quota-resets-after": world.resets_after})
                return
            self._send(*world.answer(body if isinstance(body, dict) else {}, agent))

    return Handler


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.inventory_graph")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--world", help="a JSON file: the world to start with")
    args = parser.parse_args(argv)
    world = World(json.loads(open(args.world, encoding="utf-8").read()) if args.world else None)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(world))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
