"""HTTP triggers on a loopback port: routes and methods from each binding, function-level keys."""

from __future__ import annotations

import hmac
import logging
import os
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit

import azure.functions as func

from .easyauth import EasyAuth
from .loader import FunctionSpec
from .settings import AppSettings

log = logging.getLogger("sandbox.functions")

MAX_BODY = 10 * 1024 * 1024
_PARAMETER = re.compile(r"^\{(\*?)([A-Za-z_][A-Za-z0-9_]*)(?::(int|alpha|guid))?(\?)?\}$")
_CONSTRAINTS = {
    "int": r"-?\d+",
    "alpha": r"[A-Za-z]+",
    "guid": r"[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}",
}


def route_precedence(template: str) -> Tuple[int, ...]:
    """ASP.NET Core's order for templates that match one path: per segment, a literal before a constrained
    parameter before a plain one before a catch-all (so `events/pending` wins over `events/{id}`)."""
    ranks = []
    for segment in [s for s in template.strip("/").split("/") if s]:
        match = _PARAMETER.match(segment)
        if not match:
            ranks.append(0)
        elif match.group(1):
            ranks.append(3)
        else:
            ranks.append(1 if match.group(3) else 2)
    return tuple(ranks)


def route_pattern(template: str) -> re.Pattern:
    """An ASP.NET-style route template (`a/{id}`, `{id:int}`, `{opt?}`, `{*rest}`) as a regex."""
    pattern = ""
    for segment in [s for s in template.strip("/").split("/") if s]:
        match = _PARAMETER.match(segment)
        if "{" in segment and not match:
            raise ValueError(
                f"route {template!r}: unsupported segment {segment!r} "
                "(use {name}, {name?}, {*name}, {name:int|alpha|guid})"
            )
        if not match:
            pattern += "/" + re.escape(segment)
            continue
        catch_all, name, constraint, optional = match.groups()
        body = ".*" if catch_all else _CONSTRAINTS.get(constraint or "", "[^/]+")
        piece = f"/(?P<{name}>{body})"
        pattern += f"(?:{piece})?" if optional or catch_all else piece
    return re.compile(f"^{pattern}/?$")


@dataclass
class HttpRoute:
    spec: FunctionSpec
    pattern: re.Pattern
    methods: Optional[List[str]]  # None: every method
    auth_level: str
    template: str = ""


class KeyStore:
    """Keys from the settings file's `Keys`: `master`, `host` {name: key}, `functions` {fn: {name: key}}."""

    def __init__(self, keys: Dict[str, object]) -> None:
        self.master = str(keys.get("master") or "")
        self.host = {k: str(v) for k, v in dict(keys.get("host") or {}).items() if v}  # type: ignore[call-overload]
        self.functions = {
            f: {k: str(v) for k, v in dict(ks).items() if v}
            for f, ks in dict(keys.get("functions") or {}).items()
        }  # type: ignore[call-overload]

    def allows(self, level: str, function: str, presented: Optional[str]) -> bool:
        if level == "anonymous":
            return True
        if not presented:
            return False
        accepted = [self.master] if self.master else []
        if level == "function":
            accepted += list(self.host.values()) + list(self.functions.get(function, {}).values())
        return any(hmac.compare_digest(presented.encode(), key.encode()) for key in accepted)


class HttpTriggers:
    """One ThreadingHTTPServer on 127.0.0.1 serving every HTTP-triggered function under the route prefix."""

    def __init__(
        self, specs: List[FunctionSpec], settings: AppSettings, route_prefix: str, port: int
    ) -> None:
        self.routes = sorted((self._route(spec, settings) for spec in specs),
                             key=lambda r: route_precedence(r.template))
        self.prefix = f"/{route_prefix}" if route_prefix else ""
        self.keys = KeyStore(settings.keys)
        if not (self.keys.master or self.keys.host or self.keys.functions):
            log.warning(
                'no keys in the settings file\'s "Keys": function-level routes answer 401 to everyone'
            )
        # App Service authentication in front of the host (sandbox/functions/easyauth.py)
        self.auth = EasyAuth.for_settings(settings.source)
        self.auth.environment(os.environ)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.server.daemon_threads = True
        self.thread: Optional[threading.Thread] = None

    @staticmethod
    def _route(spec: FunctionSpec, settings: AppSettings) -> HttpRoute:
        trigger = spec.trigger
        template = str(settings.resolve(trigger.get("route") or spec.name))
        methods = [str(m).upper() for m in trigger["methods"]] if trigger.get("methods") else None
        auth = str(trigger.get("authLevel", "function")).lower()
        return HttpRoute(spec, route_pattern(template), methods, auth, template)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def describe(self, spec: FunctionSpec) -> str:
        route = next(r for r in self.routes if r.spec is spec)
        methods = ",".join(route.methods) if route.methods else "*"
        return (
            f"httpTrigger [{methods}] http://127.0.0.1:{self.port}{self.prefix}/"
            f"{spec.trigger.get('route') or spec.name} auth={route.auth_level}"
        )

    def start(self) -> None:
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, name="http-triggers", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        if self.thread is not None:  # shutdown() would wait forever for a loop that never started
            self.server.shutdown()
        self.server.server_close()

    def match(self, method: str, path: str) -> Tuple[Optional[HttpRoute], Dict[str, str], List[str]]:
        """(route, route params, allowed methods of routes whose path matched)."""
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            return None, {}, []
        relative = path[len(self.prefix) :] or "/"
        allowed: List[str] = []
        for route in self.routes:
            found = route.pattern.match(relative)
            if not found:
                continue
            if route.methods is None or method in route.methods:
                return route, {k: unquote(v) for k, v in found.groupdict().items() if v is not None}, []
            allowed += route.methods
        return None, {}, allowed


def _handler(triggers: HttpTriggers) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "sandbox-functions"

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            query = dict(parse_qsl(parts.query, keep_blank_values=True))
            route, params, allowed = triggers.match(self.command, parts.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._reply(func.HttpResponse("request body too large", status_code=413))
                return
            body = self.rfile.read(length) if length else b""
            if route is None:
                status = 405 if allowed else 404
                headers = {"Allow": ", ".join(sorted(set(allowed)))} if allowed else {}
                self._reply(func.HttpResponse(status_code=status, headers=headers))
                return
            refused, headers = triggers.auth.filter(parts.path, dict(self.headers.items()))
            if refused:  # the platform answers before the host sees the request (Return401)
                log.info("401 %s %s: App Service authentication: %s", self.command, parts.path, refused)
                self._reply(func.HttpResponse(status_code=401, headers={"WWW-Authenticate": "Bearer"}))
                return
            presented = self.headers.get("x-functions-key") or query.get("code")
            if not triggers.keys.allows(route.auth_level, route.spec.name, presented):
                log.info("401 %s %s: missing or wrong function key", self.command, parts.path)
                self._reply(func.HttpResponse(status_code=401))
                return
            query.pop("code", None)
            request = func.HttpRequest(
                self.command,
                f"http://{self.headers.get('Host', '127.0.0.1')}{self.path}",
                headers=headers,
                params=query,
                route_params=params,
                body=body,
            )
            argument = str(route.spec.trigger["name"])
            try:
                result = route.spec.invoke(
                    f"This function was programmatically called via HTTP {self.command}",
                    **{argument: request},
                )
            except Exception:  # noqa: BLE001 - the host answers 500 when a function raises
                self._reply(func.HttpResponse(status_code=500))
                return
            if isinstance(result, str):
                result = func.HttpResponse(result)
            self._reply(
                result if isinstance(result, func.HttpResponse) else func.HttpResponse(status_code=204)
            )

        def _reply(self, response: func.HttpResponse) -> None:
            body = response.get_body() or b""
            self.send_response(response.status_code)
            headers = dict(response.headers)
            if body and not any(k.lower() == "content-type" for k in headers):
                headers["Content-Type"] = f"{response.mimetype}; charset={response.charset}"
            for name, value in headers.items():
                if name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("http: " + format, *args)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _serve

        def __getattr__(self, name: str) -> Any:
            # any other method (TRACE, QUERY, ...) reaches the router too: a method a route does not list
            # is 405 with Allow, as on the host (the standard library would answer 501 with an HTML page)
            if name.startswith("do_"):
                return self._serve
            raise AttributeError(name)

    return Handler
