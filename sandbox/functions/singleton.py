"""Listener singletons as the Functions host keeps them: a blob lease in AzureWebJobsStorage.

The host (WebJobs SDK `SingletonListener`, `BlobLeaseDistributedLockManager`) starts a timer trigger's
listener only on the instance that holds the lease on
`azure-webjobs-hosts/locks/{hostId}/Host.Functions.{name}.Listener` (an empty blob, created on first
use). The lease lasts `listenerLockPeriod` and is renewed every half period; an instance without it
tries again every `listenerLockRecoveryPollingInterval`; a stopping instance lets its running
invocation finish, then releases the lease. Instances share a lock when they share the storage
account and the host id, as the instances of one Function app do.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any, Optional

from .hostconfig import SingletonOptions
from .settings import AppSettings
from .storage import webjobs_container

log = logging.getLogger("sandbox.functions")

HOSTS_CONTAINER = "azure-webjobs-hosts"
HOST_ID_SETTING = "AzureFunctionsWebHost__hostid"
MAX_HOST_ID = 32
MIN_RENEWAL_INTERVAL = 1.0  # the SDK's floor when renewals fail and it retries sooner


def stable_hash(text: str) -> int:
    """A 32-bit string hash that is the same in every process (Python's hash() is salted)."""
    value = 23
    for char in text:
        value = (value * 31 + ord(char)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def host_id(settings: AppSettings, app_dir: Path, machine: Optional[str] = None) -> str:
    """The host id: app setting `AzureFunctionsWebHost__hostid`, else the host's local default (the
    machine name's letters and digits, a stable hash of the app directory), lowercase, at most 32
    characters, no trailing '-'. In Azure the default is the app's name."""
    chosen = settings.get(HOST_ID_SETTING)
    if not chosen:
        name = re.sub(r"[^0-9A-Za-z]", "", machine if machine is not None else socket.gethostname())
        chosen = f"{name}-{abs(stable_hash(str(app_dir)))}"
    return chosen[:MAX_HOST_ID].lower().rstrip("-")


def listener_lock_blob(host: str, function_name: str) -> str:
    """The lease blob of a function's listener lock (`{hostId}/{function full name}.Listener`)."""
    return f"locks/{host}/Host.Functions.{function_name}.Listener"


class ListenerLock:
    """One function's listener lock: `acquire()` once (no retries: the caller polls), a renewal thread
    while held, `release()` on stop. `held` turns false when a renewal finds the lease lost or when
    renewals fail until the lease may have run out: the holder then stops starting invocations."""

    def __init__(
        self, settings: AppSettings, host: str, function_name: str, options: SingletonOptions
    ) -> None:
        self.blob_name = listener_lock_blob(host, function_name)
        self.period = options.listener_lock_period
        self.container = webjobs_container(
            settings, HOSTS_CONTAINER, "timer triggers (singleton locks)", create=False)
        self._blob = self.container.get_blob_client(self.blob_name)
        self._lease: Optional[Any] = None
        self._valid_until = 0.0  # monotonic; the lease surely lasts until then
        self._stop_renewing = threading.Event()
        self._renewer: Optional[threading.Thread] = None

    @property
    def held(self) -> bool:
        return self._lease is not None and time.monotonic() < self._valid_until

    def acquire(self) -> bool:
        """Take the lease if it is free (available, expired or broken); False if another instance has it.
        The blob (and the container) are created on first use."""
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
        from azure.storage.blob import BlobLeaseClient

        try:
            state = self._blob.get_blob_properties().lease.state
        except ResourceNotFoundError:
            self._create_blob()
            state = "available"
        if state not in ("available", "expired", "broken"):
            return False
        lease = BlobLeaseClient(self._blob)
        started = time.monotonic()
        try:
            lease.acquire(lease_duration=int(self.period))
        except HttpResponseError as exc:
            if exc.status_code == 409:  # taken between the read and the acquire
                return False
            raise
        self._lease = lease
        self._valid_until = started + self.period
        self._stop_renewing.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{self.blob_name}", daemon=True)
        self._renewer.start()
        return True

    def _create_blob(self) -> None:
        """The empty lock blob, and its container when that is missing too (the host's TryCreateAsync)."""
        from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError

        for attempt in (1, 2):
            try:
                self._blob.upload_blob(b"", overwrite=False)
                return
            except ResourceNotFoundError:  # no container yet
                if attempt == 2:
                    raise
                try:
                    self.container.create_container()
                except ResourceExistsError:
                    pass
            except HttpResponseError as exc:  # 409 exists, 412 leased: another instance made it
                if exc.status_code not in (409, 412):
                    raise
                return

    def _renew_loop(self) -> None:
        from azure.core.exceptions import HttpResponseError

        normal = self.period / 2
        delay = normal
        while not self._stop_renewing.wait(delay):
            lease = self._lease
            if lease is None:
                return
            started = time.monotonic()
            try:
                lease.renew()
            except HttpResponseError as exc:
                if exc.status_code in (404, 409, 412):  # the blob or the lease is gone: lost for good
                    log.error("Singleton lock lost (%s): %s", self.blob_name, exc.reason)
                    self._lease = None
                    return
                delay = max(MIN_RENEWAL_INTERVAL, delay / 2)
                log.warning("Singleton lock renewal failed (%s); retrying in %.1fs", self.blob_name, delay)
                continue
            except Exception as exc:  # noqa: BLE001 - storage unreachable: retry sooner, as the SDK does
                delay = max(MIN_RENEWAL_INTERVAL, delay / 2)
                log.warning("Singleton lock renewal failed (%s: %s); retrying in %.1fs",
                            type(exc).__name__, exc, delay)
                continue
            self._valid_until = started + self.period
            delay = normal

    def release(self) -> None:
        """Stop renewing and release the lease (nothing to do when not held)."""
        from azure.core.exceptions import HttpResponseError

        self._stop_renewing.set()
        if self._renewer is not None:
            self._renewer.join(5.0)
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            lease.release()
        except HttpResponseError as exc:  # 404/409: gone or another's now; nothing of ours to release
            if exc.status_code not in (404, 409):
                log.warning("Singleton lock %s not released: %s", self.blob_name, exc.reason)

    def close(self) -> None:
        self.release()
        self.container.close()
