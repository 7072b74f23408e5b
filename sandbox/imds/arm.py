"""The ARM acknowledge API's stand-in (issue 23, point 6): approve a scheduled event with no agent, in the
fabric, exactly as an IMDS POST StartRequests does.

  POST /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/{kind}/{name}
       /providers/Microsoft.Maintenance/scheduledevents/{id}/acknowledge?api-version=V   -> 200 {"value"}
  POST .../providers/Microsoft.Maintenance/scheduledevents?api-version=V  {"value": [ids]}
       -> 200, or 207 {"response": {code, message}, "details": [{target, code, message}]} (the service's
          undocumented partial shape) when some ids are not this owner's live events

A bearer token is required: a JWT whose `aud` is ARM's and which has not expired (the sandbox's managed
identity tokens are unsigned, so the signature is not checked). `kind` must own the event: the VM for a
standalone VM, its scale set for a scale set's instances. POST /admin/arm {"throttle": N, "retryAfter": S}
makes the next N calls answer 429 with Retry-After S; {"denied": true} makes every call answer 403
AuthorizationFailed, what ARM answers an identity without Scheduled Events Contributor (a deployment without
the platform feed, whose install grants it); GET /admin/arm lists the calls made (kind, name, ids,
at, status).
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..bearer import bearer_problem
from .fabric import Fabric, UnknownEvent
from .responses import Response, json_response

_PATH = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/providers/microsoft\.compute/"
    r"(?P<kind>virtualmachines|virtualmachinescalesets|availabilitysets)/(?P<name>[^/]+)"
    r"/providers/microsoft\.maintenance/scheduledevents(?:/(?P<id>[^/]+)/acknowledge)?$", re.IGNORECASE)
AUDIENCES = ("https://management.azure.com", "https://management.core.windows.net")
VERSIONS = ("2025-11-01", "2025-10-01-preview", "2023-10-01-preview")


def arm_error(status: int, code: str, message: str, headers: Optional[Dict[str, str]] = None) -> Response:
    return json_response(status, {"error": {"code": code, "message": message}}, headers)


class ArmStandIn:
    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self._lock = threading.Lock()
        self.throttle = 0
        self.retry_after = 1.0
        self.denied = False  # every call: 403 AuthorizationFailed (the identity lacks the role)
        self.calls: List[Dict[str, Any]] = []  # what was asked (for tests)

    def configure(self, doc: Any) -> Response:
        if not isinstance(doc, dict):
            return arm_error(400, "BadRequest", "a JSON object: {throttle, retryAfter}")
        with self._lock:
            self.throttle = int(doc.get("throttle", 0))
            self.retry_after = float(doc.get("retryAfter", 1.0))
            self.denied = bool(doc.get("denied", False))
        return json_response(200, {"throttle": self.throttle, "retryAfter": self.retry_after,
                                   "denied": self.denied, "calls": len(self.calls)})

    def status(self) -> Response:
        with self._lock:
            return json_response(200, {"throttle": self.throttle, "retryAfter": self.retry_after,
                                       "calls": list(self.calls)})

    def handle(self, method: str, path: str, query: Mapping[str, str], headers: Any, body: bytes) -> Response:
        m = _PATH.match(path)
        if m is None or method != "POST":
            return arm_error(404, "NotFound", f"no ARM route {method} {path}")
        problem = arm_token_problem(headers.get("Authorization") or "")
        if problem:
            return arm_error(401, "AuthenticationFailed", problem,
                             {"WWW-Authenticate": 'Bearer authorization_uri="https://login.microsoftonline.com/"'})
        if query.get("api-version") not in VERSIONS:
            return arm_error(400, "InvalidApiVersionParameter",
                             f"api-version must be one of {list(VERSIONS)}")
        with self._lock:
            if self.throttle > 0:
                self.throttle -= 1
                return arm_error(429, "TooManyRequests", "throttled (sandbox fault)",
                                 {"Retry-After": f"{self.retry_after:g}"})
        kind, name = m["kind"].lower(), m["name"]
        if m["id"]:
            ids = [m["id"]]
        else:
            try:
                doc = json.loads(body or b"null")
            except ValueError:
                doc = None
            ids = doc.get("value") if isinstance(doc, dict) else None
            if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
                return arm_error(400, "InvalidRequestContent", "the body must be {\"value\": [event ids]}")
        self.calls.append({"kind": kind, "name": name, "ids": ids, "at": time.time()})
        if self.denied:
            return arm_error(403, "AuthorizationFailed", "The client does not have authorization to perform "
                             "action 'Microsoft.Maintenance/scheduledevents/acknowledge/action' (sandbox)")
        results = [(i, self._approve(kind, name, i)) for i in ids]
        failed = [(i, r) for i, r in results if r is not None]
        if m["id"]:
            if failed:
                return arm_error(404 if failed[0][1][0] == "NotFound" else 409, *failed[0][1])
            return json_response(200, {"value": "Successfully Approved"})
        if not failed:
            return json_response(200, {"value": "Successfully Approved"})
        return json_response(207, {
            "response": {"code": "PartialSuccess",
                         "message": f"{len(ids) - len(failed)} of {len(ids)} approved"},
            "details": [{"target": i, "code": code, "message": message} for i, (code, message) in failed]})

    def _approve(self, kind: str, name: str, event_id: str) -> Optional[Tuple[str, str]]:
        """None when approved (or already Started); else (code, message)."""
        try:
            event = self.fabric.get_event(event_id)
        except UnknownEvent:
            return ("NotFound", f"no scheduled event {event_id}")
        if event.made_up:
            return ("NotFound", f"no scheduled event {event_id}")  # Azure never knew it
        owners = [vm for vm in event.audience if self._owns(kind, name, vm)]
        if not owners:
            return ("NotFound", f"{event_id} is not an event of {kind}/{name}")
        if not event.live:
            return ("Conflict", f"{event_id} is {event.state}")
        self.fabric.approve(owners[0], [event_id])  # exactly as the VM's own IMDS POST
        return None

    def _owns(self, kind: str, name: str, vm: str) -> bool:
        ident = self.fabric.vm(vm).identity
        if kind == "virtualmachines":
            return vm.lower() == name.lower() and not ident.vmScaleSetName
        if kind == "virtualmachinescalesets":
            return ident.vmScaleSetName.lower() == name.lower()
        return True  # availability sets: the simulator keeps no membership; any VM it names


def arm_token_problem(header: str) -> str:
    return bearer_problem(header, AUDIENCES, "ARM")
