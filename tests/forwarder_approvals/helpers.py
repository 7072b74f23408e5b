"""A rig for the approval tests: the real ImdsClient against the simulator, real QueueClients against
Azurite, the real ledger and SQLite outbox, the real ApprovalService. Nothing of ours is mocked."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional

from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient

from forwarder import hooks
from forwarder.approvals import naming
from forwarder.approvals.reader import ReaderSettings
from forwarder.approvals.service import ApprovalService, ApprovalSettings
from forwarder.identity import from_compute
from forwarder.imds import ImdsClient
from forwarder.outbox import Outbox
from sandbox.imds.client import ImdsSimulator

VM0 = {"name": "vm0", "vmId": "0f8e6b52-1d5c-4d3a-9a61-2b7c1e0a0000"}
VM1 = {"name": "vm1", "vmId": "0f8e6b52-1d5c-4d3a-9a61-2b7c1e0a0001"}
TIME_SCALE = "60"  # 15 simulated minutes of notice = 15 s real


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def approval(event_id: str, vm: Dict[str, str] = VM0, action: str = "approve", expires_in: float = 600.0,
             **overrides: Any) -> Dict[str, Any]:
    now = datetime.now(timezone.utc)
    msg = {"schemaVersion": 1, "messageId": str(uuid.uuid4()), "eventId": event_id, "vmId": vm["vmId"],
           "vmName": vm["name"], "action": action, "decidedBy": "policy:test-rule", "reason": "test",
           "issuedAt": iso(now), "expiresAt": iso(now + timedelta(seconds=expires_in)), "incarnation": 1}
    msg.update(overrides)
    return msg


def write_hook(hook_dir: Path, phase: str, name: str, body: str, mode: int = 0o755) -> Path:
    directory = hook_dir / f"{phase}.d"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    os.chmod(path, mode)
    return path


@dataclass
class Rig:
    sim: ImdsSimulator
    imds: ImdsClient
    service: ApprovalService
    outbox: Outbox
    queue: QueueClient
    state_dir: Path
    hook_dir: Path

    # ---- queue ------------------------------------------------------------------------------
    def send(self, message: Any) -> None:
        self.queue.send_message(message if isinstance(message, str) else json.dumps(message))

    def queue_empty(self) -> bool:
        return not list(self.queue.peek_messages(max_messages=32))

    # ---- driving ----------------------------------------------------------------------------
    def document(self) -> Dict[str, Any]:
        return json.loads(self.imds.get_scheduled_events().text)

    def observe(self) -> Dict[str, Any]:
        """What the poller does after each poll: hand the document to the service's subscriber."""
        doc = self.document()
        self.service.subscriber(doc)
        return doc

    def poll(self) -> None:
        self.service.ensure_reader().poll_once()

    # ---- what happened ----------------------------------------------------------------------
    def posts(self, vm: Optional[str] = None) -> List[Dict[str, Any]]:
        return self.sim.requests(vm=vm, method="POST")

    def results(self) -> List[Dict[str, Any]]:
        """Approval-result envelopes in the outbox (the durable record), in order."""
        return [item.envelope for item in self.outbox.peek(1000)
                if item.type == "scheduledevents.approvalresult.v1"]

    def outcomes(self) -> List[tuple]:
        return [(r["data"]["outcome"], r["data"]["reason"]) for r in self.results()]


def make_rig(sim_url: str, conn: str, tmp: Path, vm: Dict[str, str] = VM0, keep_queue: bool = False,
             **reader: Any) -> Rig:
    sim = ImdsSimulator(sim_url)
    imds = ImdsClient(sim.vm_url(vm["name"]), retry_seconds=3.0, first_timeout=5.0)
    state_dir, hook_dir = tmp / "state", tmp / "hooks"
    state_dir.mkdir(exist_ok=True)
    hook_dir.mkdir(exist_ok=True)
    identity = from_compute(imds.get_compute())
    settings = ApprovalSettings(
        state_dir=str(state_dir), queue_connection_string=conn,
        reader=ReaderSettings(**{"fast_interval": 0.2, "slow_interval": 1.0, "visibility_timeout": 2,
                                 "max_dequeue": 3, "poison_dir": str(state_dir / "rejected"), **reader}),
        hooks=hooks.HookSettings(hook_dir=str(hook_dir), timeout_seconds=2.0),
        local_approve=True)
    outbox = Outbox(state_dir)
    service = ApprovalService(settings, imds, outbox, lambda: identity)
    queue = QueueClient.from_connection_string(conn, naming.queue_name(vm["vmId"]))
    try:
        queue.create_queue()
    except ResourceExistsError:
        if not keep_queue:
            queue.clear_messages()
    return Rig(sim, imds, service, outbox, queue, state_dir, hook_dir)
