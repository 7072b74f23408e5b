"""Schema-valid envelopes for central's tests (central never imports the forwarder; neither do these)."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any, Callable, Dict, List, Optional

import schemas

T0 = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)  # a Saturday


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc1123(moment: datetime) -> str:
    return format_datetime(moment.astimezone(timezone.utc).replace(microsecond=0), usegmt=True)


def event(
    event_id: str,
    resources: List[str],
    event_type: str = "Reboot",
    status: str = "Scheduled",
    not_before: Optional[datetime] = None,
    source: str = "Platform",
    duration: int = -1,
) -> Dict[str, Any]:
    return {
        "EventId": event_id,
        "EventStatus": status,
        "EventType": event_type,
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "NotBefore": "" if status == "Started" else rfc1123(not_before or T0 + timedelta(minutes=15)),
        "Description": f"{event_type} test",
        "EventSource": source,
        "DurationInSeconds": duration,
    }


@dataclass
class Vm:
    name: str
    vm_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    scale_set: str = ""
    tags: Dict[str, str] = field(default_factory=dict)
    subscription: str = "0000"  # what its attested document names too (tests.signing signs as claimed)
    incarnation: int = 0
    previous: Optional[int] = None
    events: List[Dict[str, Any]] = field(default_factory=list)

    def identity(self) -> Dict[str, Any]:
        vm: Dict[str, Any] = {
            "vmId": self.vm_id,
            "name": self.name,
            "resourceId": (f"/subscriptions/{self.subscription}/resourceGroups/rg/providers/Microsoft.Compute"
                           f"/vm/{self.name}"),
            "tags": dict(self.tags),
        }
        if self.scale_set:
            vm["vmScaleSetName"] = self.scale_set
            vm["placementGroupId"] = f"pg-{self.scale_set}"
        return vm

    def _wrap(self, type_: str, id_: str, data: Dict[str, Any], at: datetime) -> Dict[str, Any]:
        env = {
            "specversion": "1.0",
            "id": id_,
            "source": self.identity()["resourceId"],
            "type": f"scheduledevents.{type_}.v1",
            "subject": self.name,
            "time": iso(at),
            "datacontenttype": "application/json",
            "partitionkey": self.vm_id,
            "data": data,
        }
        errors = schemas.errors("envelope.schema.json", env)
        assert not errors, errors
        return env

    def incarnation_env(self, events: List[Dict[str, Any]], at: datetime = T0) -> Dict[str, Any]:
        """The next incarnation of this VM's document listing `events`."""
        self.previous = self.incarnation if self.incarnation else None
        self.incarnation += 1
        before = {e["EventId"]: e for e in self.events}
        after = {e["EventId"]: e for e in events}
        diff = {
            "new": [e for k, e in after.items() if k not in before],
            "changed": [
                {"before": before[k], "after": e} for k, e in after.items() if k in before and before[k] != e
            ],
            "gone": [e for k, e in before.items() if k not in after],
        }
        self.events = list(events)
        doc = {"DocumentIncarnation": self.incarnation, "Events": events}
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
        data = {
            "vm": self.identity(),
            "incarnation": self.incarnation,
            "previousIncarnation": self.previous,
            "reset": False,
            "apiVersion": "2020-07-01",
            "document": doc,
            "diff": diff,
            "observedAt": iso(at),
        }
        return self._wrap("incarnation", f"{self.vm_id}:incarnation:{self.incarnation}:{digest}", data, at)

    def heartbeat(self, at: datetime = T0, dropped: int = 0) -> Dict[str, Any]:
        data = {
            "vm": self.identity(),
            "forwarder": {"version": "0.1.0", "startedAt": iso(T0 - timedelta(hours=1))},
            "lastIncarnation": self.incarnation or None,
            "scheduledEventIds": [e["EventId"] for e in self.events if e["EventStatus"] == "Scheduled"],
            "outbox": {"backlog": 0, "dropped": dropped, "lastSendAt": iso(at), "lastError": None},
        }
        return self._wrap("heartbeat", f"{self.vm_id}:heartbeat:{iso(at)}", data, at)

    def result(
        self, event_id: str, outcome: str, message_id: Optional[str], at: datetime = T0
    ) -> Dict[str, Any]:
        data = {
            "vm": self.identity(),
            "eventId": event_id,
            "messageId": message_id,
            "outcome": outcome,
            "reason": f"test {outcome}",
            "decidedBy": "policy:test",
            "hook": None,
            "at": iso(at),
        }
        return self._wrap(
            "approvalresult", f"{self.vm_id}:result:{event_id}:{message_id}:{outcome}", data, at
        )

    def quarantined(self, raw: str, at: datetime = T0) -> Dict[str, Any]:
        data = {
            "vm": self.identity(),
            "apiVersion": "2020-07-01",
            "raw": raw,
            "rawSha256": hashlib.sha256(raw.encode()).hexdigest(),
            "document": None,
            "incarnation": None,
            "errors": [{"path": "/", "message": "not JSON"}],
            "observedAt": iso(at),
        }
        return self._wrap("quarantined", f"{self.vm_id}:quarantined:{data['rawSha256'][:16]}", data, at)


def body(env: Dict[str, Any]) -> bytes:
    return json.dumps(env).encode()


def at_once(*calls: Callable[[], Any]) -> List[Any]:
    """Run `calls` on threads of their own, released together (a race between instances); their
    results in order. The first call that raised re-raises here."""
    gate = threading.Barrier(len(calls))

    def go(call: Callable[[], Any]) -> Any:
        gate.wait(timeout=10)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result(timeout=60) for f in [pool.submit(go, call) for call in calls]]
