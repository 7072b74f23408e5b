"""The /metadata routes, checked in IMDS's order of concerns, with faults applied last."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

from .clock import iso
from .fabric import Fabric, UnknownEvent
from .faults import Fault, FaultBook
from .ratelimit import SlidingWindowLimiter
from .responses import Response, error, json_response
from .versions import (
    ATTESTED_VERSIONS,
    INSTANCE_VERSIONS,
    SCHEDULED_EVENTS_VERSIONS,
    TOKEN_VERSIONS,
    render_event,
)

ROUTES: Dict[str, Any] = {  # path -> (route name for faults, allowed methods, valid api-versions)
    "/metadata/scheduledevents": ("scheduledevents", ("GET", "POST"), SCHEDULED_EVENTS_VERSIONS),
    "/metadata/instance/compute": ("compute", ("GET",), INSTANCE_VERSIONS),
    "/metadata/instance": ("compute", ("GET",), INSTANCE_VERSIONS),
    "/metadata/identity/oauth2/token": ("token", ("GET",), TOKEN_VERSIONS),
    "/metadata/attested/document": ("attested", ("GET",), ATTESTED_VERSIONS),
}


@dataclass
class Request:
    vm: str
    method: str
    path: str  # without any /vms/<name> prefix
    query: Dict[str, str]
    headers: Mapping[str, str]  # case-insensitive (http.client.HTTPMessage)
    body: bytes


class MetadataService:
    def __init__(self, fabric: Fabric, faults: FaultBook, limiter: SlidingWindowLimiter,
                 first_call_delay: float = 0.0) -> None:
        self.fabric, self.faults, self.limiter = fabric, faults, limiter
        self.first_call_delay = first_call_delay
        self.attested: Optional[Any] = None  # an attested.AttestedDocuments; set by server.build
        self.token_lifetime = TOKEN_LIFETIME  # seconds a token lasts (--token-lifetime; soaks shorten it)

    def handle(self, req: Request) -> Response:
        if self.fabric.count_call(req.vm) == 0 and self.first_call_delay > 0:
            time.sleep(self.first_call_delay)  # "the first call can take up to 2 minutes"
        if not self.limiter.admit(req.vm):
            return error(429, "Too many requests")
        if req.headers.get("X-Forwarded-For") is not None:
            return error(400, "Bad request. Requests carrying an X-Forwarded-For header are rejected")
        if (req.headers.get("Metadata") or "").lower() != "true":
            return error(400, "Bad request. Required metadata header not specified")
        route = ROUTES.get(req.path.rstrip("/") or "/")
        if route is None:
            return error(404, "Not found")
        name, methods, versions = route
        if req.method not in methods:
            return Response(405, json.dumps({"error": "Method not allowed"}).encode(),
                            {"Allow": ", ".join(methods), "Content-Type": "application/json; charset=utf-8"})
        version = req.query.get("api-version")
        if version not in versions:
            why = "was not specified" if not version else f"'{version}' is invalid"
            return error(400, f"Bad request. api-version {why}. For more information refer to "
                         "aka.ms/azureimds",
                         **{"newest-versions": list(versions[-3:][::-1]), "valid-versions": list(versions)})
        bad = None
        for fault in self.faults.take(req.vm, name, req.method):
            if fault.kind == "slow":
                time.sleep(fault.seconds)
            else:
                bad = fault
        if bad is not None and bad.kind == "status":
            return error(bad.status, f"Injected fault: status {bad.status}")
        if name == "scheduledevents":
            return self._scheduled_events(req, version, bad)
        if name == "compute":
            return self._compute(req, bad)
        if name == "attested":
            return self._attested(req, bad)
        return self._token(req, bad)

    # ---- routes ----------------------------------------------------------------------------
    def _scheduled_events(self, req: Request, version: str, bad: Optional[Fault]) -> Response:
        if req.method == "POST":
            return self._start_requests(req)
        incarnation, events = self.fabric.document(req.vm)
        rendered = (render_event(ev, version) for ev in events)
        shown: List[Dict[str, Any]] = [e for e in rendered if e is not None]
        doc: Dict[str, Any] = {"DocumentIncarnation": incarnation, "Events": shown}
        if bad is not None:
            return _bad_body(bad, doc)
        body = json.dumps(doc, separators=(",", ":")).encode()
        # ETag support is ours: the docs do not promise it, so clients must work without it.
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        if etag_matches(req.headers.get("If-None-Match"), etag):
            return Response(304, b"", {"ETag": etag})
        return Response(200, body, {"Content-Type": "application/json; charset=utf-8", "ETag": etag})

    def _start_requests(self, req: Request) -> Response:
        try:
            payload = json.loads(req.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return error(400, "Bad request. The body is not valid JSON")
        ids = _start_request_ids(payload)
        if isinstance(ids, str):
            return error(400, f"Bad request. {ids}")
        try:
            self.fabric.approve(req.vm, ids)
        except UnknownEvent as exc:
            # Our choice: the docs are silent on unknown ids; a typo must not pass silently.
            return error(400, f"Bad request. Unknown EventId: {exc.args[0]}")
        return Response(200, b"")

    def _compute(self, req: Request, bad: Optional[Fault]) -> Response:
        compute = self.fabric.vm(req.vm).identity.compute()
        doc = compute if req.path.rstrip("/").endswith("compute") else {"compute": compute, "network": {}}
        return _bad_body(bad, doc) if bad is not None else json_response(200, doc)

    def _attested(self, req: Request, bad: Optional[Fault]) -> Response:
        from .attested import BadNonce  # the route's own module (sandbox/imds/attested.py)

        if self.attested is None:
            return error(404, "Not found (attested documents are off in this simulator)")
        try:
            doc = self.attested.document(req.vm, self.fabric.vm(req.vm).identity, req.query.get("nonce"))
        except BadNonce as exc:
            return error(400, f"Bad request. {exc}")
        return _bad_body(bad, doc) if bad is not None else json_response(200, doc)

    def _token(self, req: Request, bad: Optional[Fault]) -> Response:
        resource = req.query.get("resource")
        if not resource:
            return json_response(400, {"error": "invalid_request",
                                       "error_description": "Required query variable 'resource' is missing"})
        now = int(time.time())
        ident = self.fabric.vm(req.vm).identity
        life = self.token_lifetime
        doc = {"access_token": sandbox_token(ident, resource, now, life), "refresh_token": "",
               "expires_in": str(life), "expires_on": str(now + life), "ext_expires_in": str(life),
               "not_before": str(now), "resource": resource, "token_type": "Bearer",
               "client_id": ident.vmId}
        return _bad_body(bad, doc) if bad is not None else json_response(200, doc)


SANDBOX_TENANT = "00000000-0000-0000-0000-00000000beef"
TOKEN_LIFETIME = 86399  # as Entra ID's managed-identity tokens (~24 h)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sandbox_token(ident: Any, resource: str, now: int, lifetime: int = TOKEN_LIFETIME) -> str:
    """A JWT-shaped managed-identity token, as Entra ID issues them (aud = the resource, iss = the tenant's
    STS, iat/nbf/exp, the VM's identity in oid/xms_mirid), with an invalid signature: emulators that
    check a token's shape and lifetime without verifying it (Azurite's `--oauth basic`) accept it; nothing
    that verifies signatures ever will. It is not a credential for anything."""
    header = {"typ": "JWT", "alg": "RS256", "kid": "sandbox-unsigned"}
    claims = {"aud": resource, "iss": f"https://sts.windows.net/{SANDBOX_TENANT}/", "iat": now, "nbf": now,
              "exp": now + lifetime, "tid": SANDBOX_TENANT, "oid": ident.vmId, "sub": ident.vmId,
              "appid": ident.vmId, "xms_mirid": ident.resourceId, "ver": "1.0"}
    parts = [json.dumps(part, separators=(",", ":")).encode() for part in (header, claims)]
    return ".".join([*(_b64url(part) for part in parts), _b64url(b"sandbox-unsigned")])


def etag_matches(if_none_match: Optional[str], etag: str) -> bool:
    """RFC 9110 If-None-Match: `*`, or a comma-separated list of entity tags compared weakly (a `W/`
    prefix on either side is ignored), e.g. `W/"a", "b"`."""
    if not if_none_match:
        return False
    if if_none_match.strip() == "*":
        return True

    def opaque(tag: str) -> str:
        tag = tag.strip()
        return tag[2:] if tag[:2] in ("W/", "w/") else tag

    return opaque(etag) in {opaque(t) for t in if_none_match.split(",") if t.strip()}


def _start_request_ids(payload: Any) -> Any:
    """The EventIds of a StartRequests body, or a message saying what is wrong with it."""
    if not isinstance(payload, dict):
        return "The body must be a JSON object"
    requests = payload.get("StartRequests")
    if not isinstance(requests, list):
        return "'StartRequests' must be a list"
    if not requests:
        return "'StartRequests' is empty"  # our choice: nothing to start is a malformed request
    ids = []
    for item in requests:
        event_id = item.get("EventId") if isinstance(item, dict) else None
        if not isinstance(event_id, str) or not event_id:
            return "Each StartRequest must be an object with a non-empty string 'EventId'"
        ids.append(event_id)
    return ids


def _bad_body(fault: Fault, doc: Dict[str, Any]) -> Response:
    """200 with a body a client must not trust: broken JSON, or JSON that fails the schema."""
    if fault.kind == "malformed":
        text = json.dumps(doc)
        return Response(200, text[: max(1, len(text) // 2)].encode(), {"Content-Type": "application/json"})
    broken = dict(doc)
    if "Events" in broken:
        broken["Events"] = [*doc["Events"], {"EventId": "", "EventStatus": "Completed",
                                               "EventType": "Explode", "ResourceType": "VirtualMachine",
                                               "Resources": "not-a-list"}]
        broken["DocumentIncarnation"] = -1
    else:
        broken = {**doc, "vmId": None, "name": 42, "generatedAt": iso(time.time())}
    return json_response(200, broken)
