"""The runner's pieces on their own: settings and connections, host.json, routes, keys, retries, schedules."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from sandbox.functions.hostconfig import HostConfig, SingletonOptions, timespan_seconds
from sandbox.functions.http import KeyStore, route_pattern
from sandbox.functions.retry import RetryPolicy, Stopped
from sandbox.functions.settings import AppSettings, SettingsError, expand_development_storage
from sandbox.functions.singleton import host_id, listener_lock_blob
from sandbox.functions.timer import next_occurrence_function


def settings(values: dict) -> AppSettings:
    return AppSettings(values=values)


def test_binding_expressions_resolve_from_app_settings() -> None:
    s = settings({"HUB": "scheduled-events", "GROUP": "central"})
    assert s.resolve("%HUB%") == "scheduled-events"
    assert s.resolve("%HUB%/%GROUP%") == "scheduled-events/central"
    assert s.resolve("literal") == "literal"


def test_a_missing_setting_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="'HUB'"):
        settings({}).resolve("%HUB%")


def test_connection_string_setting_wins_then_azurewebjobs_prefix_then_identity_section() -> None:
    assert settings({"Hubs": "Endpoint=sb://x"}).connection("Hubs").connection_string == "Endpoint=sb://x"
    assert (
        settings({"AzureWebJobsHubs": "Endpoint=sb://y"}).connection("Hubs").connection_string
        == "Endpoint=sb://y"
    )
    identity = settings(
        {
            "Hubs__fullyQualifiedNamespace": "ns.servicebus.windows.net",
            "Hubs__credential": "managedidentity",
            "Hubs__clientId": "abc",
        }
    ).connection("Hubs")
    assert identity.identity_based
    assert identity.section == {
        "fullyQualifiedNamespace": "ns.servicebus.windows.net",
        "credential": "managedidentity",
        "clientId": "abc",
    }


def test_an_undefined_connection_names_both_forms() -> None:
    with pytest.raises(SettingsError, match="Hubs__fullyQualifiedNamespace"):
        settings({"Other": "x"}).connection("Hubs")


def test_development_storage_expands_to_the_full_azurite_string() -> None:
    full = expand_development_storage("UseDevelopmentStorage=true")
    assert (
        "AccountName=devstoreaccount1" in full
        and "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1" in full
    )
    assert expand_development_storage("AccountName=a;AccountKey=b") == "AccountName=a;AccountKey=b"


def test_settings_file_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps({"IsEncrypted": False, "Values": {"A": 1, "B": None}, "Keys": {"master": "m"}})
    )
    loaded = AppSettings.load(path)
    assert loaded.values == {"A": "1", "B": ""}
    assert loaded.keys == {"master": "m"}
    path.write_text(json.dumps({"IsEncrypted": True, "Values": {}}))
    with pytest.raises(SettingsError, match="encrypted"):
        AppSettings.load(path)
    with pytest.raises(SettingsError, match="does not exist"):
        AppSettings.load(tmp_path / "missing.json")


def test_host_json_event_hubs_options_and_defaults(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(
        json.dumps(
            {
                "version": "2.0",
                "extensions": {
                    "eventHubs": {
                        "maxEventBatchSize": 7,
                        "prefetchCount": 14,
                        "batchCheckpointFrequency": 2,
                        "minEventBatchSize": 5,
                        "maxWaitTime": "00:00:03",
                        "initialOffsetOptions": {"type": "fromEnd"},
                    },
                    "http": {"routePrefix": ""},
                },
            }
        )
    )
    host = HostConfig.load(path)
    assert (
        host.event_hubs.max_event_batch_size,
        host.event_hubs.prefetch_count,
        host.event_hubs.batch_checkpoint_frequency,
        host.event_hubs.initial_offset,
    ) == (7, 14, 2, "fromEnd")
    assert (host.event_hubs.min_event_batch_size, host.event_hubs.max_wait_time) == (5, 3.0)
    assert host.route_prefix == ""
    assert HostConfig.load(tmp_path / "absent.json").event_hubs.max_event_batch_size == 100
    assert HostConfig.load(tmp_path / "absent.json").route_prefix == "api"


def test_repository_host_json_is_read_by_the_runner() -> None:
    host = HostConfig.load(Path(__file__).resolve().parents[2] / "host.json")
    assert host.retry is not None and RetryPolicy.from_mapping(host.retry).strategy == "exponentialBackoff"
    # the reevaluate timer moves to another instance within 30 s of its holder's crash (defaults: 2 min)
    assert host.singleton.takeover_seconds() == (7.5, 30)


def test_singleton_defaults_are_the_hosts_and_host_json_overrides_them() -> None:
    defaults = SingletonOptions.from_mapping({})
    assert (defaults.listener_lock_period, defaults.listener_lock_recovery_polling_interval) == (60, 60)
    assert defaults.takeover_seconds() == (30, 120)  # crash of the holder: half a lease .. lease + poll
    short = SingletonOptions.from_mapping(
        {"listenerLockPeriod": "00:00:15", "listenerLockRecoveryPollingInterval": "00:00:20"})
    assert short.takeover_seconds() == (7.5, 35)


@pytest.mark.parametrize("raw", [{"listenerLockPeriod": "00:00:10"}, {"lockPeriod": "00:02:00"},
                                 {"listenerLockRecoveryPollingInterval": "00:00:05"}])
def test_singleton_periods_outside_what_a_blob_lease_allows_are_refused(raw: dict) -> None:
    with pytest.raises(ValueError, match="singleton"):
        SingletonOptions.from_mapping(raw)


def test_host_id_is_the_setting_or_a_stable_local_default() -> None:
    assert host_id(settings({"AzureFunctionsWebHost__hostid": "My-App-"}), Path("/x")) == "my-app"
    local = host_id(settings({}), Path("/srv/app"), machine="build-07.example")
    assert local == "build07example-251135983"  # letters and digits of the name, the path hash
    assert local == host_id(settings({}), Path("/srv/app"), machine="build-07.example")  # every process
    assert local != host_id(settings({}), Path("/srv/other"), machine="build-07.example")
    assert len(host_id(settings({"AzureFunctionsWebHost__hostid": "x" * 40}), Path("/x"))) == 32
    assert listener_lock_blob("my-app", "reevaluate") == "locks/my-app/Host.Functions.reevaluate.Listener"


@pytest.mark.parametrize(("text", "seconds"), [("00:00:05", 5), ("01:02:03", 3723), ("1.00:00:00", 86400)])
def test_timespans(text: str, seconds: float) -> None:
    assert timespan_seconds(text) == seconds


@pytest.mark.parametrize(
    ("template", "path", "params"),
    [
        ("events/pending", "/events/pending", {}),
        ("events/{event_id}/{action:alpha}", "/events/E-1/approve", {"event_id": "E-1", "action": "approve"}),
        ("items/{id:int}", "/items/42", {"id": "42"}),
        ("files/{*rest}", "/files/a/b/c", {"rest": "a/b/c"}),
        ("opt/{name?}", "/opt", {}),
    ],
)
def test_routes_match_with_parameters(template: str, path: str, params: dict) -> None:
    match = route_pattern(template).match(path)
    assert match is not None
    assert {k: v for k, v in match.groupdict().items() if v is not None} == params


@pytest.mark.parametrize(
    ("template", "path"),
    [
        ("events/pending", "/events/pending/x"),
        ("items/{id:int}", "/items/abc"),
        ("events/{event_id}/{action:alpha}", "/events/E-1/app-rove"),
        ("health", "/healthz"),
    ],
)
def test_routes_do_not_match_other_paths(template: str, path: str) -> None:
    assert route_pattern(template).match(path) is None


def test_function_keys_by_level() -> None:
    keys = KeyStore({"master": "M", "host": {"default": "H"}, "functions": {"f": {"default": "F"}}})
    assert keys.allows("anonymous", "f", None)
    assert (
        keys.allows("function", "f", "F")
        and keys.allows("function", "g", "H")
        and keys.allows("function", "g", "M")
    )
    assert not keys.allows("function", "g", "F"), "a function key opens its own function only"
    assert not keys.allows("function", "f", None) and not keys.allows("function", "f", "")
    assert keys.allows("admin", "f", "M") and not keys.allows("admin", "f", "H")
    assert not KeyStore({}).allows("function", "f", ""), "no keys configured: nothing opens"


def test_exponential_backoff_doubles_up_to_the_maximum() -> None:
    policy = RetryPolicy.from_mapping(
        {
            "strategy": "exponentialBackoff",
            "maxRetryCount": -1,
            "minimumInterval": "00:00:02",
            "maximumInterval": "00:00:10",
        }
    )
    assert [policy.delay_before(n) for n in range(1, 6)] == [2, 4, 8, 10, 10]
    fixed = RetryPolicy.from_mapping(
        {"strategy": "fixed_delay", "max_retry_count": "3", "delay_interval": "00:00:04"}
    )
    assert (fixed.strategy, fixed.max_retry_count, fixed.delay_before(3)) == ("fixedDelay", 3, 4)


def test_retries_until_success_then_gives_up_after_max_count() -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("storage down")
        return "ok"

    policy = RetryPolicy("fixedDelay", 2, delay=0.0)
    assert policy.run(flaky, threading.Event(), "f") == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(ConnectionError):
        RetryPolicy("fixedDelay", 1, delay=0.0).run(flaky, threading.Event(), "f")
    assert len(calls) == 2


def test_stopping_interrupts_endless_retries() -> None:
    stop = threading.Event()
    stop.set()

    def failing() -> None:
        raise ConnectionError("down")

    with pytest.raises(Stopped):
        RetryPolicy("exponentialBackoff", -1, minimum=30, maximum=60).run(failing, stop, "f")


def test_ncrontab_six_fields_seconds_first() -> None:
    after = datetime(2026, 1, 1, 0, 0, 1, tzinfo=timezone.utc)
    every_five_seconds = next_occurrence_function("*/5 * * * * *")
    assert every_five_seconds(after) == datetime(2026, 1, 1, 0, 0, 5, tzinfo=timezone.utc)
    every_five_minutes = next_occurrence_function("0 */5 * * * *")
    assert every_five_minutes(after) == datetime(2026, 1, 1, 0, 5, 0, tzinfo=timezone.utc)
    assert next_occurrence_function("00:00:30")(after) == datetime(2026, 1, 1, 0, 0, 31, tzinfo=timezone.utc)


@pytest.mark.parametrize("schedule", ["*/5 * * * *", "61 * * * * *", "nonsense"])
def test_invalid_schedules_are_refused(schedule: str) -> None:
    with pytest.raises(ValueError):
        next_occurrence_function(schedule)


def test_runner_refuses_to_start_when_a_binding_setting_is_missing(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "local.settings.json"
    path.write_text(json.dumps({"Values": {"FUNCTIONS_WORKER_RUNTIME": "python"}}))
    result = subprocess.run(
        [sys.executable, "-m", "sandbox.functions", "--settings", str(path), "--port", "0"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "EVENTHUB_NAME" in result.stderr and "does not define" in result.stderr


def test_min_event_batch_size_holds_a_partitions_events_until_enough_or_max_wait() -> None:
    """The host's minEventBatchSize / maxWaitTime (sandbox.functions.batching): a partition's events wait
    for a batch of that many, or until maxWaitTime after the first was cached, whatever the receive loop
    does meanwhile; the partition's first invocation does not wait; batches of at most maxEventBatchSize."""
    import threading
    from types import SimpleNamespace

    from sandbox.functions.eventhub import EventHubTrigger
    from sandbox.functions.hostconfig import EventHubOptions

    wait = 0.5
    trigger = EventHubTrigger.__new__(EventHubTrigger)
    trigger.options = EventHubOptions(max_event_batch_size=4, min_event_batch_size=3, max_wait_time=wait)
    trigger.stop, trigger.batchers = threading.Event(), {}
    calls: list = []

    def dispatch(context: SimpleNamespace, events: list) -> None:
        calls.append((context.partition_id, list(events), time.monotonic()))

    def next_call(count: int) -> tuple:
        deadline = time.monotonic() + 5
        while len(calls) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return calls[count - 1][:2] if len(calls) >= count else ()

    trigger._dispatch = dispatch
    p0, p1 = SimpleNamespace(partition_id="0"), SimpleNamespace(partition_id="1")
    trigger._on_batch(p0, ["a", "b", "c", "d", "e", "f", "g"])  # enough: batches of at most 4, at once
    assert [c[:2] for c in calls] == [("0", ["a", "b", "c", "d"]), ("0", ["e", "f", "g"])]
    trigger._on_batch(p1, ["first"])  # a partition's first invocation does not wait (the extension's rule)
    assert next_call(3) == ("1", ["first"])
    cached = time.monotonic()
    trigger._on_batch(p1, ["x"])
    trigger._on_batch(p1, ["y"])
    assert len(calls) == 3  # fewer than 3 held, maxWaitTime not over: nothing yet
    # no receive-loop wake-up comes: the partition's own timer sends the partial batch
    assert next_call(4) == ("1", ["x", "y"])
    assert wait <= calls[3][2] - cached < 2 * wait  # maxWaitTime after the first was cached, not twice it
    trigger._on_batch(p1, ["z"])
    trigger._on_partition_close(p1, "OWNERSHIP_LOST")  # the cache is dropped: the next owner reads it again
    time.sleep(wait * 1.5)
    assert len(calls) == 4


def test_an_execution_logs_its_own_cpu_beside_the_hosts_lines(caplog: pytest.LogCaptureFixture) -> None:
    """The runner logs each execution's thread CPU (bench.fleet_cost prices GB-s from it) on a line of
    its own, after the host's Executed line, which keeps the host's format."""
    import logging

    from bench.fleet_units import CPU, EXECUTED
    from sandbox.functions.loader import FunctionSpec

    def busy() -> int:
        return sum(i * i for i in range(200_000))  # some CPU, so the figure is above zero

    spec = FunctionSpec("busy", {"type": "timerTrigger"}, [], busy, None)
    with caplog.at_level(logging.INFO, logger="sandbox.functions"):
        spec.invoke("test")
    lines = [r.getMessage() for r in caplog.records]
    assert EXECUTED.match(lines[-2])
    found = CPU.match(lines[-1])
    assert found and found.group(1) == "busy" and int(found.group(2)) > 0
