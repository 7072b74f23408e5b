"""Central's fixtures: a webhook receiver (real HTTP) and services on the session's Azurite."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest
import requests
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from central.runtime.approval_queue import queue_name
from central.runtime.service import CentralService
from central.store.state_rows import read_table
from central.telemetry import metrics
from sandbox import processes
from tests import signing


@pytest.fixture(scope="session")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    server = processes.start_webhook_receiver(log_dir=tmp_path_factory.mktemp("webhook"))
    server.extra["url"] = f"http://127.0.0.1:{server.port}"
    yield server
    server.stop()


class Hook:
    """The receiver's view: what arrived, how many POSTs were tried."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.delete(f"{url}/alerts", timeout=5)

    def alerts(self) -> List[Dict[str, Any]]:
        return [a["body"] for a in self.entries()]

    def entries(self) -> List[Dict[str, Any]]:
        """Every alert as received: body, path, time and the Idempotency-Key header."""
        return list(self.session.get(f"{self.url}/alerts", timeout=5).json())

    def attempts(self) -> int:
        return self.session.get(f"{self.url}/admin/stats", timeout=5).json()["attempts"]

    def fail_next(self, count: int, status: int = 500) -> None:
        self.session.post(f"{self.url}/admin/fail", json={"count": count, "status": status}, timeout=5)


@pytest.fixture
def hook(webhook: processes.Server) -> Iterator[Hook]:
    h = Hook(webhook.extra["url"])
    yield h
    h.fail_next(0)


class Env:
    """One test's storage world: settings, services built from them, and direct SDK views."""

    def __init__(self, conn: str, hook_url: str) -> None:
        self.conn = conn
        self.prefix = "t" + uuid.uuid4().hex[:12]
        self.hook_url = hook_url
        self.tables = TableServiceClient.from_connection_string(conn)
        self.queues = QueueServiceClient.from_connection_string(conn)

    def settings(self, **extra: str) -> Dict[str, str]:
        base = {
            "ApprovalStorage": self.conn,
            "TABLE_PREFIX": self.prefix,
            "ALERT_WEBHOOK_URL": self.hook_url,
            "ALERT_WEBHOOK_FORMAT": "generic",
            "ALERT_BACKOFF_SECONDS": "0.05",
            "APPROVAL_RESULT_TIMEOUT_SECONDS": "120",
            "LEADER_LIVENESS_SECONDS": "300",
        }
        base.update(extra)
        return base

    def service(self, **extra: str) -> CentralService:
        """Central in its default configuration (AUTHN_MODE=required); the only trust added is the
        sandbox's test root, and the envelopes come signed as each VM's forwarder signs them."""
        return signing.central(self.settings(**extra))

    def rows(self, table: str) -> List[Dict[str, Any]]:
        """A log table's rows; "Events" and "Vms": those kinds of rows of the State table."""
        return read_table(self.tables, self.prefix, table)

    def messages(self, vm_id: str) -> List[Dict[str, Any]]:
        """Approval messages waiting on a VM's queue (peeked, not consumed)."""
        client = self.queues.get_queue_client(queue_name(vm_id))
        try:
            return [json.loads(m.content) for m in client.peek_messages(max_messages=32)]
        except Exception:  # the queue does not exist: nothing was ever sent to this VM
            return []


@pytest.fixture
def env(azurite: processes.Server, hook: Hook) -> Env:
    return Env(azurite.extra["connection_string"], hook.url)


ServiceFactory = Callable[..., CentralService]


@pytest.fixture
def tmp_dir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    """central's metrics into memory for one test (tests/central/test_metrics*.py)."""
    memory = InMemoryMetricReader()
    previous = metrics.use(MeterProvider(metric_readers=[memory]))
    yield memory
    metrics.restore(previous)
