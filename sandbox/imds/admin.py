"""The admin API (JSON, under /admin): VMs, events, faults, the request log, reset."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from . import events as events_mod
from . import faults as faults_mod
from .clock import iso, rfc1123
from .events import SimEvent
from .fabric import Conflict, Fabric, UnknownEvent, UnknownVm
from .faults import FaultBook
from .identity import from_spec
from .ratelimit import SlidingWindowLimiter
from .requestlog import RequestLog
from .responses import Response, error, json_response
from .versions import SCHEDULED_EVENTS_VERSIONS, render_event


def event_json(event: SimEvent) -> Dict[str, Any]:
    def when(t: Optional[float]) -> Optional[str]:
        return iso(t) if t is not None else None

    return {
        "eventId": event.event_id, "eventType": event.event_type, "eventSource": event.event_source,
        "resources": event.resources, "audience": event.audience, "state": event.state,
        "status": event.state if event.live else None,
        "notBefore": rfc1123(event.not_before) if event.not_before else "",
        "noticeSeconds": event.notice_seconds, "durationInSeconds": event.duration_in_seconds,
        "startedSeconds": event.started_seconds, "description": event.description,
        "createdAt": when(event.created_at), "startedAt": when(event.started_at),
        "goneAt": when(event.gone_at) if event.live else when(event.ended_at),
        "approvedBy": event.approved_by,
        "madeUp": event.made_up,
    }


class AdminApi:
    def __init__(self, fabric: Fabric, faults: FaultBook, limiter: SlidingWindowLimiter,
                 log: RequestLog) -> None:
        self.fabric, self.faults, self.limiter, self.log = fabric, faults, limiter, log

    def handle(self, method: str, parts: List[str], query: Dict[str, str], body: bytes) -> Response:
        """`parts`: the path after /admin, split on '/'."""
        try:
            payload = json.loads(body.decode("utf-8")) if body.strip() else {}
        except (UnicodeDecodeError, ValueError):
            return error(400, "the body is not valid JSON")
        try:
            return self._route(method, parts, query, payload)
        except ValueError as exc:
            return error(409 if isinstance(exc, Conflict) else 400, str(exc))
        except UnknownVm as exc:
            return error(404, f"unknown VM {exc.args[0]!r}")
        except UnknownEvent as exc:
            return error(404, f"unknown event {exc.args[0]!r}")

    def _route(self, method: str, parts: List[str], query: Dict[str, str], payload: Any) -> Response:
        head = parts[0] if parts else ""
        if head == "health" and method == "GET":
            return json_response(200, {"status": "ok", "vms": self.fabric.vm_names(),
                                       "timeScale": self.fabric.clock.scale})
        if head == "vms":
            return self._vms(method, parts[1:], query, payload)
        if head == "events":
            return self._events(method, parts[1:], payload)
        if head == "faults" and len(parts) == 1:
            if method == "POST":
                return self._add_fault(payload)
            if method == "GET":
                return json_response(200, self.faults.armed())
            if method == "DELETE":
                self.faults.clear()
                return json_response(200, {"cleared": True})
        if head == "requests" and len(parts) == 1:
            if method == "GET":
                found = self.log.query(query.get("vm"), query.get("method"), query.get("path"))
                return json_response(200, found)
            if method == "DELETE":
                self.log.clear()
                return json_response(200, {"cleared": True})
        if head == "reset" and method == "POST":
            self.fabric.reset()
            self.faults.clear()
            self.log.clear()
            self.limiter.clear()
            return json_response(200, {"reset": True})
        return error(404, "no such admin route (see docs/imds-simulator.md)")

    def _vms(self, method: str, rest: List[str], query: Dict[str, str], payload: Any) -> Response:
        if not rest and method == "GET":
            return json_response(200, [self.fabric.vm(n).identity.compute() for n in self.fabric.vm_names()])
        if not rest and method == "POST":
            return json_response(201, self.fabric.add_vm(from_spec(payload)).compute())
        if len(rest) == 1 and method == "GET":
            return json_response(200, self.fabric.vm(rest[0]).identity.compute())
        if len(rest) == 2 and rest[1] == "move" and method == "POST":
            spec = payload if isinstance(payload, dict) else {}
            return json_response(200, self.fabric.move_vm(rest[0], spec).compute())
        if len(rest) == 2 and rest[1] == "document" and method == "GET":
            # The VM's document without rate limit, faults or log: for tests and operators.
            version = query.get("api-version") or SCHEDULED_EVENTS_VERSIONS[-1]
            if version not in SCHEDULED_EVENTS_VERSIONS:
                raise ValueError(f"api-version must be one of {list(SCHEDULED_EVENTS_VERSIONS)}")
            incarnation, evs = self.fabric.document(rest[0])
            shown = [e for e in (render_event(ev, version) for ev in evs) if e is not None]
            return json_response(200, {"DocumentIncarnation": incarnation, "Events": shown})
        return error(404 if method in ("GET", "POST") else 405, "no such admin route")

    def _events(self, method: str, rest: List[str], payload: Any) -> Response:
        if not rest and method == "POST":
            event = events_mod.from_request(payload, self.fabric.vm_names())
            return json_response(201, event_json(self.fabric.add_event(event)))
        if not rest and method == "GET":
            return json_response(200, [event_json(e) for e in self.fabric.list_events()])
        if len(rest) == 1 and method == "GET":
            return json_response(200, event_json(self.fabric.get_event(rest[0])))
        if len(rest) == 2 and method == "POST" and rest[1] in ("cancel", "start"):
            event = self.fabric.cancel(rest[0]) if rest[1] == "cancel" else self.fabric.start_now(rest[0])
            return json_response(200, event_json(event))
        return error(404, "no such admin route")

    def _add_fault(self, payload: Any) -> Response:
        fault = faults_mod.from_request(payload, self.fabric.vm_names())
        if fault.kind == "reset":  # acts at once: the incarnation drops as after an IMDS reset
            names = [fault.vm] if fault.vm else self.fabric.vm_names()
            dropped = self.fabric.reset_incarnation(names, fault.incarnation)
            return json_response(201, {**fault.to_json(), "incarnations": dropped})
        self.faults.add(fault)
        return json_response(201, fault.to_json())
