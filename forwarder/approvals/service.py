"""Wires the approval parts into the daemon: built lazily once the poller knows this VM's identity.

- `subscriber(document)`: given to the poller; feeds the fast path, recovery and the reader's pace.
- `step(stop)`: the daemon worker; one queue receive + the adaptive wait (disabled without a queue).
- `publish(result)`: the approval-result envelope into the durable outbox (returns once durable).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from .. import envelope, hooks
from ..fastpath import FastPath
from ..identity import VmIdentity
from ..recovery import Recovery
from . import naming, queue
from .approver import Approver
from .ledger import Ledger
from .reader import ApprovalReader, ReaderSettings
from .result import ApprovalResult

log = logging.getLogger(__name__)


@dataclass
class ApprovalSettings:
    state_dir: str
    queue_service_uri: str = ""
    queue_connection_string: str = ""
    credential: Any = None  # for queue_service_uri: the IMDS-rate-limited managed identity credential
    reader: ReaderSettings = field(default_factory=ReaderSettings)
    hooks: hooks.HookSettings = field(default_factory=hooks.HookSettings)
    local_event_types: Sequence[str] = ("Preempt", "Terminate")
    local_approve: bool = False

    @property
    def queue_enabled(self) -> bool:
        return bool(self.queue_service_uri or self.queue_connection_string)


class ApprovalService:
    def __init__(self, settings: ApprovalSettings, imds: Any, outbox: Any,
                 identity: Callable[[], VmIdentity], wake_publisher: Optional[Callable[[], None]] = None,
                 stop: Optional[threading.Event] = None) -> None:
        self.settings = settings
        self.imds = imds
        self.outbox = outbox
        self.identity = identity  # the poller's ensure_identity (fetches once, refreshes)
        self.wake_publisher = wake_publisher
        self.stop = stop or threading.Event()
        self.ledger = Ledger(settings.state_dir)
        self._lock = threading.Lock()
        self.vm: Optional[VmIdentity] = None
        self.approver: Optional[Approver] = None
        self.fastpath: Optional[FastPath] = None
        self.recovery: Optional[Recovery] = None
        self.reader: Optional[ApprovalReader] = None

    def _ready(self) -> Approver:
        with self._lock:
            if self.approver is None:
                vm = self.identity()
                self.vm = vm
                self.approver = Approver(self.imds, self.ledger, vm.vm_id, vm.name, self.settings.hooks)
                self.fastpath = FastPath(self.approver, self.publish, tuple(self.settings.local_event_types),
                                         self.settings.local_approve)
                self.recovery = Recovery(self.settings.state_dir, vm.vm_id, vm.name, self.publish,
                                         self.settings.hooks)
                if self.settings.queue_enabled:
                    if self.settings.reader.visibility_timeout < self.settings.hooks.timeout_seconds + 30:
                        log.warning("approval visibility timeout %ss is not above the hook timeout "
                                    "%ss + 30 s: a message may outlive its invisibility while its hook runs",
                                    self.settings.reader.visibility_timeout,
                                    self.settings.hooks.timeout_seconds)
                    name = naming.queue_name(vm.vm_id)
                    client = queue.queue_client(name, self.settings.queue_service_uri or None,
                                                self.settings.queue_connection_string or None,
                                                self.settings.credential)
                    poison = None
                    if self.settings.reader.poison_queue:
                        poison = queue.queue_client(queue.poison_queue_name(name),
                                                    self.settings.queue_service_uri or None,
                                                    self.settings.queue_connection_string or None,
                                                    self.settings.credential)
                    self.reader = ApprovalReader(client, self.approver, self.ledger, self.publish,
                                                 self.settings.reader, poison_queue=poison, stop=self.stop)
                    log.info("approval queue %s (fast %.1fs while Scheduled, slow %.1fs)", name,
                             self.settings.reader.fast_interval, self.settings.reader.slow_interval)
            return self.approver

    def publish(self, result: ApprovalResult) -> None:
        vm = self.vm or self.identity()
        self.outbox.put(envelope.approval_result(vm, result.data(vm.as_vm())))
        if self.wake_publisher is not None:
            self.wake_publisher()

    def subscriber(self, document: Dict[str, Any]) -> None:
        self._ready()
        assert self.fastpath is not None and self.recovery is not None
        self.recovery.observe(document)
        self.fastpath.observe(document)
        if self.reader is not None:
            self.reader.observe(document)

    def step(self, stop: threading.Event) -> None:
        self._ready()
        if self.reader is None:
            stop.wait(3600.0)  # no queue configured: nothing to read (fast path and recovery still run)
            return
        self.reader.step()

    def close(self) -> None:
        for part in (self.fastpath, self.recovery):
            if part is not None:
                part.join(timeout=2.0)
        if self.reader is not None:
            for client in (self.reader.queue, self.reader.poison_queue):
                if client is not None:
                    client.close()


def poison_dir(state_dir: str) -> str:
    return str(Path(state_dir) / "approvals-rejected")
