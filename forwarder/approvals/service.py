"""Wires the approval parts into the daemon: built lazily once the poller knows this VM's identity.

- `subscriber(document)`: given to the poller; feeds the fast path, recovery and the reader's pace.
- `step(stop)`: the daemon worker; one queue receive + the adaptive wait (disabled without a queue).
- `publish(result)`: the approval-result envelope into the durable outbox (returns once durable).

Nothing is built (or imported) before it can matter: the approver, fast path and recovery when a
document first lists an event naming this VM (or recovery has events left from a previous run); the
queue reader (with the Storage queue SDK and the token client) on the worker's thread when IMDS first
lists a Scheduled event for this VM. An idle VM carries none of it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from .. import envelope
from ..identity import VmIdentity
from .gate import events_of, has_scheduled, involves
from .settings import ApprovalSettings, ReaderSettings

__all__ = ["ApprovalService", "ApprovalSettings", "ReaderSettings", "poison_dir"]

RECOVERY_FILE = "recovery-watched.json"  # forwarder/recovery.py's state (its FILE_NAME)

log = logging.getLogger(__name__)


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
        self.ledger: Any = None  # the Ledger, opened with the approver
        self._lock = threading.Lock()
        self.vm: Optional[VmIdentity] = None
        self.approver: Any = None  # Approver, FastPath, Recovery, ApprovalReader once built
        self.fastpath: Any = None
        self.recovery: Any = None
        self.reader: Any = None
        self._document: Optional[Dict[str, Any]] = None  # the last document observed
        self._wake = threading.Event()  # set when a Scheduled event for this VM appears

    def _ready(self) -> Any:
        """The approver, fast path and recovery (built on first need)."""
        with self._lock:
            if self.approver is None:
                from ..fastpath import FastPath
                from ..recovery import Recovery
                from .approver import Approver
                from .ledger import Ledger

                vm = self.identity()
                self.ledger = Ledger(self.settings.state_dir)
                self.vm = vm
                self.approver = Approver(self.imds, self.ledger, vm.vm_id, vm.name, self.settings.hooks,
                                         require_hook=self.settings.require_hook)
                self.fastpath = FastPath(self.approver, self.publish, tuple(self.settings.local_event_types),
                                         self.settings.local_approve)
                self.recovery = Recovery(self.settings.state_dir, vm.vm_id, vm.name, self.publish,
                                         self.settings.hooks)
            return self.approver

    def _credential(self) -> Any:
        credential = self.settings.credential
        return credential() if callable(credential) else credential

    def _build_reader(self, approver: Any) -> Any:
        """The queue clients and the reader (imports the Storage queue SDK: the first time it is needed)."""
        from . import naming, queue
        from .reader import ApprovalReader

        assert self.vm is not None
        name = naming.queue_name(self.vm.vm_id)
        uri, conn = self.settings.queue_service_uri or None, self.settings.queue_connection_string or None
        credential = self._credential() if uri else None
        client = queue.queue_client(name, uri, conn, credential)
        poison = None
        if self.settings.reader.poison_queue:
            poison = queue.queue_client(queue.poison_queue_name(name), uri, conn, credential)
        log.info("approval queue %s: read every %.1fs while IMDS lists a Scheduled event for this VM",
                 name, self.settings.reader.fast_interval)
        return ApprovalReader(client, approver, self.ledger, self.publish, self.settings.reader,
                              poison_queue=poison, stop=self.stop)

    def publish(self, result: Any) -> None:
        # the identity as the poller last read it (not the one of the first approval): after Azure moves
        # the VM, its results name the resourceId the attested document vouches for now
        vm = self.identity()
        self.outbox.put(envelope.approval_result(vm, result.data(vm.as_vm())))
        if self.wake_publisher is not None:
            self.wake_publisher()

    def _needed(self, document: Dict[str, Any]) -> bool:
        """Whether the approval parts have anything to do: an event naming this VM, or recovery state
        left by a previous run (an event that ended while the forwarder was down)."""
        if self.approver is not None:
            return True
        name = self.identity().name
        if any(involves(e, name) for e in events_of(document)):
            return True
        try:
            watched = (Path(self.settings.state_dir) / RECOVERY_FILE).read_text(encoding="utf-8")
        except OSError:
            return False
        return watched.strip() not in ("", "{}")

    def subscriber(self, document: Dict[str, Any]) -> None:
        self._document = document
        if not self._needed(document):
            return
        approver = self._ready()
        assert self.fastpath is not None and self.recovery is not None
        self.recovery.observe(document)
        self.fastpath.observe(document)
        if self.reader is not None:
            self.reader.observe(document)
        elif has_scheduled(document, approver.vm_name):
            self._wake.set()

    def step(self, stop: threading.Event) -> None:
        if not self.settings.queue_enabled:
            stop.wait(3600.0)  # no queue configured: nothing to read (fast path and recovery still run)
            return
        if self.reader is None:
            document = self._document
            if document is None or not has_scheduled(document, self.identity().name):
                self._wake.wait(1.0)  # 1 s slices: `stop` is seen promptly
                self._wake.clear()
                return
        self.ensure_reader().step()

    def ensure_reader(self) -> Any:
        """The queue reader, built now if it is not yet (the worker does it when first needed)."""
        approver = self._ready()
        with self._lock:
            if self.reader is None:
                self.reader = self._build_reader(approver)
                if self._document is not None:
                    self.reader.observe(self._document)
            return self.reader

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
