"""The real function_app.py in the runner: Event Hubs server -> ingest -> central -> log store in Azurite."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableServiceClient
from azure.eventhub import EventData, EventHubProducerClient

from sandbox import processes
from sandbox.functions.issuer import LocalIssuer
from tests import signing

from .conftest import RunnerFiles, start_runner, wait_until

REPO = processes.REPO
HUB = "scheduled-events"
KEY = "e2e-function-key"
PREFIX = "e2e"
ENVELOPE = json.loads((REPO / "schemas" / "examples" / "envelope" / "incarnation.json").read_text())


@pytest.fixture
def central_runner(
    azurite: processes.Server, eventhubs_server: processes.Server, tmp_path: Path
) -> Iterator[Tuple[processes.Server, RunnerFiles]]:
    storage = azurite.extra["connection_string"]
    files = RunnerFiles(tmp_path / "central")
    files.write(
        signing.with_trust({
            "AzureWebJobsStorage": storage,
            "ApprovalStorage": storage,
            **processes.central_hub_settings(eventhubs_server.port, HUB),
            "EVENTHUB_CONSUMER_GROUP": "central-e2e",
            "TABLE_PREFIX": PREFIX,
            "POLICY_JSON": "",
            "ALERT_WEBHOOK_URL": "",
            "ALERT_WEBHOOK_FORMAT": "generic",
            "REEVALUATE_SCHEDULE": "*/2 * * * * *",
        }),
        keys={"host": {"default": KEY}},
        auth=LocalIssuer(tmp_path / "central" / "issuer").init().auth_section(),
    )
    runner = start_runner(files, "function_app")
    yield runner, files
    runner.stop()


def get(
    runner: processes.Server,
    path: str,
    key: Optional[str] = KEY,
    body: Optional[dict] = None,
    headers: Optional[Dict[str, str]] = None,
) -> Tuple[int, object]:
    headers = {**({"x-functions-key": key} if key else {}), **(headers or {})}
    if "api/health" not in path:  # the operators' routes: signed in (App Service authentication)
        token = LocalIssuer(Path(runner.log_path).parent / "issuer").token("ops@example.com", ["Operator"])
        headers.setdefault("Authorization", f"Bearer {token}")
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://127.0.0.1:{runner.port}{path}",
        headers=headers,
        data=data,
        method="POST" if data is not None else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None


def rows(storage: str, table: str) -> list:
    try:
        return list(
            TableServiceClient.from_connection_string(storage).get_table_client(table).list_entities()
        )
    except ResourceNotFoundError:
        return []


def test_an_envelope_published_to_event_hubs_reaches_the_central_log_store(
    azurite: processes.Server, eventhubs_server: processes.Server, central_runner
) -> None:
    runner, _ = central_runner
    producer = EventHubProducerClient.from_connection_string(
        processes.eventhubs_connection_string(eventhubs_server.port, HUB)
    )
    with producer:
        batch = producer.create_batch(partition_key=ENVELOPE["partitionkey"])
        batch.add(signing.event_data(json.dumps(ENVELOPE).encode()))
        batch.add(EventData(b"{not an envelope"))
        producer.send_batch(batch)

    storage = azurite.extra["connection_string"]
    incarnations = wait_until(
        lambda: [r for r in rows(storage, f"{PREFIX}Incarnations") if r["EnvelopeId"] == ENVELOPE["id"]],
        30,
        "the incarnation row",
        runner,
    )
    assert incarnations[0]["VmId"] == ENVELOPE["partitionkey"]
    assert incarnations[0]["Incarnation"] == ENVELOPE["data"]["incarnation"]
    # The bad body in the same batch is recorded, not raised: the batch went through once.
    assert wait_until(lambda: rows(storage, f"{PREFIX}Quarantine"), 15, "the quarantine row", runner)
    log = runner.log_path.read_text() if runner.log_path else ""
    assert "Executed 'Functions.ingest' (Failed" not in log

    status, health = get(runner, "/api/health")
    assert status == 200 and isinstance(health, dict) and health["knownVms"] == 1
    status, pending = get(runner, "/api/events/pending")
    assert status == 200 and isinstance(pending, list)
    assert get(runner, "/api/events/pending", headers={"Authorization": ""})[0] == 401
    event_ids = [e["EventId"] for e in ENVELOPE["data"]["document"]["Events"]]
    assert event_ids and [p for p in pending if p["eventId"] in event_ids], (
        "the envelope's events are pending"
    )

    status, held = get(
        runner,
        f"/api/events/{event_ids[0]}/hold",
        body={"reason": "change freeze"},
    )
    assert status == 200, held
    assert "ops@example.com" in json.dumps(held)
    assert get(runner, f"/api/events/{event_ids[0]}/hold", body={"operator": "ops"})[0] == 400, (
        "a reason is required"
    )
    assert get(runner, "/api/events/no-such-event/approve", body={"operator": "ops", "reason": "r"})[0] == 404
    assert (
        get(runner, f"/api/events/{event_ids[0]}/explode", body={"operator": "ops", "reason": "r"})[0] == 404
    )
    wait_until(  # a singleton: an earlier runner of this app killed on this Azurite holds it <= 30 s
        lambda: "Executed 'Functions.reevaluate' (Succeeded" in runner.log_path.read_text(),
        45,
        "the re-evaluation timer",
        runner,
    )
