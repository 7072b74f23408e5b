"""Shared by the central fault tests: synthetic VMs' envelopes, the real function_app.py in the runner,
and readers of what central left behind (Azurite queues and tables, the webhook receiver's record)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional

import requests
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableServiceClient
from azure.eventhub import EventHubProducerClient
from azure.storage.queue import QueueServiceClient

from central.runtime.approval_queue import queue_name
from central.store.state_rows import read_table
from sandbox import processes
from tests import signing
from tests.central.factory import Vm, event
from tests.forwarder.helpers import wait_until
from tests.functions.conftest import RunnerFiles, start_runner

HUB = "scheduled-events"
PREFIX = "fault"


def now() -> datetime:
    return datetime.now(timezone.utc)


class Fleet:
    """VMs, each with one Reboot event it walks through Scheduled -> Started -> gone (Completed)."""

    def __init__(self, count: int) -> None:
        self.vms = [Vm(name=f"fvm{i:03d}") for i in range(count)]
        self.events = {vm.name: str(uuid.uuid4()).upper() for vm in self.vms}
        self.not_before = now() + timedelta(hours=2)

    def wave(self, step: int) -> List[Dict[str, Any]]:
        """Step 0: event Scheduled (+ a heartbeat); 1: Started; 2: gone. Every VM's next incarnation."""
        out = []
        for vm in self.vms:
            eid = self.events[vm.name]
            if step == 0:
                events = [event(eid, [vm.name], "Reboot", "Scheduled", not_before=self.not_before)]
            elif step == 1:
                events = [event(eid, [vm.name], "Reboot", "Started")]
            else:
                events = []
            out.append(vm.incarnation_env(events, at=now()))
            if step == 0:
                out.append(vm.heartbeat(at=now()))
        return out


def publish(connection_string: str, envelopes: List[Dict[str, Any]]) -> None:
    """Each envelope in its VM's partition (partition key = vmId), as the forwarder publishes."""
    producer = EventHubProducerClient.from_connection_string(connection_string)
    with producer:
        by_vm: Dict[str, List[Dict[str, Any]]] = {}
        for env in envelopes:
            by_vm.setdefault(env["partitionkey"], []).append(env)
        for key, items in by_vm.items():
            batch = producer.create_batch(partition_key=key)
            for env in items:
                batch.add(signing.event_data(json.dumps(env).encode()))
            producer.send_batch(batch)


def runner_settings(files: RunnerFiles, storage: str, eventhubs_port: int, group: str,
                    webhook: str, extra: Optional[Dict[str, str]] = None) -> None:
    files.write(signing.with_trust({
        "AzureWebJobsStorage": storage,
        "ApprovalStorage": storage,
        **processes.central_hub_settings(eventhubs_port, HUB),
        "EVENTHUB_CONSUMER_GROUP": group,
        "TABLE_PREFIX": PREFIX,
        "POLICY_JSON": "",
        "ALERT_WEBHOOK_URL": webhook,
        "ALERT_WEBHOOK_FORMAT": "generic",
        "REEVALUATE_SCHEDULE": "*/2 * * * * *",
        # No failover during the test: one approval attempt per event is the expected count.
        "APPROVAL_RESULT_TIMEOUT_SECONDS": "3600",
        "ALERT_BACKOFF_SECONDS": "0.1",
        "STATUS_ALERT_MIN_SEVERITY": "info",  # every status's alert: the most deliveries to check
        **(extra or {}),
    }), keys={"host": {"default": "fault-key"}})


def start_central(files: RunnerFiles) -> processes.Server:
    return start_runner(files, "function_app")


def log_counts(server: processes.Server) -> Counter:
    text = server.log_path.read_text(errors="replace") if server.log_path and server.log_path.exists() else ""
    return Counter(executing=text.count("Executing 'Functions.ingest'"),
                   executed=text.count("Executed 'Functions.ingest'"))


def table_rows(storage: str, table: str, prefix: str = PREFIX) -> List[Dict[str, Any]]:
    """A log table, or "Events" / "Vms": those rows of the State table."""
    return read_table(TableServiceClient.from_connection_string(storage), prefix, table)


def approval_messages(storage: str, vm_id: str) -> List[Dict[str, Any]]:
    client = QueueServiceClient.from_connection_string(storage).get_queue_client(queue_name(vm_id))
    try:
        return [json.loads(m.content) for m in client.peek_messages(max_messages=32)]
    except ResourceNotFoundError:
        return []


def webhook_alerts(webhook: processes.Server) -> List[Dict[str, Any]]:
    resp = requests.get(f"http://127.0.0.1:{webhook.port}/alerts", timeout=10)
    resp.raise_for_status()
    # a POST cut short by a SIGKILLed central arrives with no readable body: it delivered nothing
    return [a["body"] for a in resp.json() if isinstance(a.get("body"), dict)]


def wait_for(predicate: Any, timeout: float, what: str, step: float = 0.25) -> Any:
    return wait_until(predicate, timeout=timeout, step=step, what=what)


def runner_dir(tmp: Path, n: int) -> RunnerFiles:
    return RunnerFiles(tmp / f"central-{n}")
