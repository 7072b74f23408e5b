"""The runner's Event Hubs trigger: the real consumer client on the sandbox server, checkpoints in Azurite."""

from __future__ import annotations

import time
from collections import Counter
from typing import Dict, Iterator, List

import pytest
from azure.eventhub import EventData, EventHubProducerClient
from azure.storage.blob import ContainerClient

from sandbox import processes
from sandbox.functions.eventhub import CHECKPOINT_CONTAINER

from .conftest import RunnerFiles, start_runner, wait_until

HUB = "sample"
BATCH = 10


@pytest.fixture
def hub(tmp_path) -> Iterator[processes.Server]:
    server = processes.start_eventhubs([f"{HUB}=2"], log_dir=tmp_path)
    yield server
    server.stop()


def publish(server: processes.Server, bodies_by_partition: Dict[str, List[str]]) -> None:
    """Real producer; partition key = 'key-<partition>' so the function sees it back."""
    producer = EventHubProducerClient.from_connection_string(
        processes.eventhubs_connection_string(server.port, HUB)
    )
    with producer:
        for partition, bodies in bodies_by_partition.items():
            batch = producer.create_batch(partition_id=partition)
            for body in bodies:
                event = EventData(body)
                event.raw_amqp_message.annotations[b"x-opt-partition-key"] = f"key-{partition}"
                batch.add(event)
            producer.send_batch(batch)


def delivered(files: RunnerFiles) -> List[dict]:
    """Events of the invocations that returned."""
    return [
        e for r in files.read_records() if r["function"] == "collect" and not r["failed"] for e in r["events"]
    ]


def checkpointed(azurite: processes.Server, group: str) -> Dict[str, int]:
    """partition -> checkpointed sequence number of `group`, read from the checkpoint blobs' metadata."""
    container = ContainerClient.from_connection_string(
        azurite.extra["connection_string"], CHECKPOINT_CONTAINER
    )
    found = {}
    for blob in container.list_blobs(name_starts_with="", include=["metadata"]):
        if f"/{HUB}/{group.lower()}/checkpoint/" in blob.name:
            found[blob.name.rsplit("/", 1)[1]] = int(blob.metadata["sequencenumber"])
    return found


def test_batches_are_delivered_then_checkpointed_and_a_restart_resumes_without_redelivery(
    azurite: processes.Server, hub: processes.Server, runner_files: RunnerFiles
) -> None:
    group = "restart"  # Azurite is shared by the session: a consumer group of its own per test
    first = {"0": [f"a-0-{i}" for i in range(24)], "1": [f"a-1-{i}" for i in range(6)]}
    publish(hub, first)
    runner_files.write(
        {
            "AzureWebJobsStorage": azurite.extra["connection_string"],
            "SampleHubs": processes.eventhubs_connection_string(hub.port, HUB),
            "SAMPLE_HUB": HUB,
            "SAMPLE_GROUP": group,
            "TICK_SCHEDULE": "0 0 0 1 1 *",
        },
        host={
            "version": "2.0",
            "extensions": {
                "eventHubs": {"maxEventBatchSize": BATCH, "prefetchCount": 20, "batchCheckpointFrequency": 1}
            },
        },
    )

    runner = start_runner(runner_files, "tests.functions.sample_app")
    try:
        wait_until(lambda: len(delivered(runner_files)) >= 30, 30, "30 events", runner)
        # Each batch's checkpoint is written after the function returned: wait for the last ones.
        wait_until(
            lambda: checkpointed(azurite, group) == {"0": 23, "1": 5}, 20, "checkpoints at 23 and 5", runner
        )
    finally:
        runner.stop()
    assert runner.proc.returncode == 0, "SIGTERM stops the runner gracefully"

    batches = [r["events"] for r in runner_files.read_records() if r["function"] == "collect"]
    assert max(len(b) for b in batches) <= BATCH, "host.json maxEventBatchSize caps each invocation"
    assert any(len(b) > 1 for b in batches), "cardinality many: events arrive in batches"
    events = delivered(runner_files)
    assert sorted(e["body"] for e in events) == sorted(first["0"] + first["1"])
    for partition, bodies in first.items():
        mine = [e for e in events if e["body"].startswith(f"a-{partition}-")]
        assert [e["body"] for e in mine] == bodies, "in order within a partition"
        assert [e["sequence_number"] for e in mine] == list(range(len(bodies)))
        assert all(e["partition_key"] == f"key-{partition}" for e in mine)
        assert all(isinstance(e["offset"], str) and e["enqueued_time"] for e in mine)
        assert all(e["iothub_metadata"] is None for e in mine)

    second = {"0": ["b-0-0", "b-0-1"], "1": ["b-1-0", "b-1-1"]}
    publish(hub, second)
    runner = start_runner(runner_files, "tests.functions.sample_app")
    try:
        # Redelivered old events would come before the new ones of their partition, so once every
        # new event is in, any redelivery would already show.
        wait_until(
            lambda: {"b-0-1", "b-1-1"} <= {e["body"] for e in delivered(runner_files)},
            30,
            "the new events after the restart",
            runner,
        )
    finally:
        runner.stop()
    counts = Counter(e["body"] for e in delivered(runner_files))
    assert set(counts) == set(first["0"] + first["1"] + second["0"] + second["1"])
    assert [body for body, n in counts.items() if n > 1] == [], "no redelivery of checkpointed events"


def test_a_failing_batch_is_retried_and_checkpointed_only_after_the_function_returned(
    azurite: processes.Server, hub: processes.Server, runner_files: RunnerFiles
) -> None:
    group = "retry"
    publish(hub, {"0": ["r-0", "r-1", "r-2"]})
    values = {
        "AzureWebJobsStorage": azurite.extra["connection_string"],
        "SampleHubs": processes.eventhubs_connection_string(hub.port, HUB),
        "SAMPLE_HUB": HUB,
        "SAMPLE_GROUP": group,
        "TICK_SCHEDULE": "0 0 0 1 1 *",
    }
    host = {
        "version": "2.0",
        "retry": {"strategy": "fixedDelay", "maxRetryCount": -1, "delayInterval": "00:00:01"},
    }

    # 1. The store is "down" for good: retried again and again, never checkpointed; stopping loses nothing.
    runner_files.write({**values, "FAIL_FIRST_CALLS": "1000"}, host=host)
    runner = start_runner(runner_files, "tests.functions.sample_app")
    try:
        wait_until(lambda: len(runner_files.read_records()) >= 2, 20, "two failed attempts", runner)
    finally:
        runner.stop()
    assert runner.proc.returncode == 0
    attempts = [r for r in runner_files.read_records() if r["function"] == "collect"]
    assert all(r["failed"] for r in attempts)
    assert all([e["body"] for e in r["events"]] == ["r-0", "r-1", "r-2"] for r in attempts), (
        "the same batch again"
    )
    assert checkpointed(azurite, group) == {}, "nothing checkpointed while the function kept failing"

    # 2. A restart redelivers the batch; two more failures, then it returns and only then is checkpointed.
    runner_files.records.unlink()
    runner_files.write({**values, "FAIL_FIRST_CALLS": "2"}, host=host)
    runner = start_runner(runner_files, "tests.functions.sample_app")
    try:
        wait_until(lambda: delivered(runner_files), 20, "a successful invocation", runner)
        wait_until(
            lambda: checkpointed(azurite, group) == {"0": 2}, 20, "the checkpoint at sequence 2", runner
        )
    finally:
        runner.stop()
    attempts = [r for r in runner_files.read_records() if r["function"] == "collect"]
    assert [r["failed"] for r in attempts] == [True, True, False]
    assert [e["body"] for e in delivered(runner_files)] == ["r-0", "r-1", "r-2"]
    assert runner.log_path is not None and "retry 2 in 1.0s" in runner.log_path.read_text()


def test_the_sdk_loop_the_idle_wait_relies_on_is_still_there() -> None:
    """sandbox.functions.eventhub_idle waits in `EventProcessor._consumers.items()`: the loop of `start` must
    still read it that way, and `__init__` still create it (fails when azure-eventhub changes under it)."""
    import inspect

    from azure.eventhub._eventprocessor import event_processor

    from sandbox.functions import eventhub_idle

    assert "list(self._consumers.items())" in inspect.getsource(event_processor.EventProcessor.start)
    assert "self._consumers: Dict[str, EventHubConsumer] = {}" in inspect.getsource(event_processor)
    eventhub_idle.install()
    eventhub_idle.install()  # idempotent: one wrapper
    assert event_processor.EventProcessor._sandbox_waits_idle is True


def test_a_runner_that_owns_no_partition_waits_instead_of_spinning(
    azurite: processes.Server, tmp_path, runner_files: RunnerFiles
) -> None:
    """Two runners on a one-partition hub (the platform hub's shape): the one that owns nothing stays idle.
    Without sandbox.functions.eventhub_idle it held the GIL in azure-eventhub's receive loop (~1 CPU s/s)."""
    import psutil

    one = processes.start_eventhubs([f"{HUB}=1"], log_dir=tmp_path)
    second = RunnerFiles(tmp_path / "second")
    runners = []
    try:
        for files in (runner_files, second):
            files.write(
                {"AzureWebJobsStorage": azurite.extra["connection_string"],
                 "SampleHubs": processes.eventhubs_connection_string(one.port, HUB), "SAMPLE_HUB": HUB,
                 "SAMPLE_GROUP": "idle", "TICK_SCHEDULE": "0 0 0 1 1 *"},
                host={"version": "2.0", "extensions": {"eventHubs": {"maxEventBatchSize": BATCH}}},
            )
            runners.append(start_runner(files, "tests.functions.sample_app"))
        time.sleep(8.0)  # both started and the one partition claimed
        procs = [psutil.Process(r.proc.pid) for r in runners]
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(4.0)
        rates = sorted((sum(p.cpu_times()[:2]) - b) / 4.0 for p, b in zip(procs, before))
    finally:
        for r in runners:
            r.stop()
        one.stop()
    assert rates[-1] < 0.25, f"runners' idle CPU s/s: {rates}"
