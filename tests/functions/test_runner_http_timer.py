"""The runner's HTTP and timer triggers on the test-only sample app (Azurite + the Event Hubs server)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import pytest

from sandbox import processes

from .conftest import RunnerFiles, start_runner, wait_until

KEY = "test-function-key"


@pytest.fixture(scope="module")
def web_runner(
    azurite: processes.Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tuple[processes.Server, RunnerFiles]]:
    """A module-wide runner; its Event Hubs trigger reads a hub of its own; the timer ticks each second."""
    directory = tmp_path_factory.mktemp("web")
    hubs = processes.start_eventhubs(["web=1"], log_dir=directory)
    files = RunnerFiles(Path(directory) / "runner")
    files.write(
        {
            "AzureWebJobsStorage": azurite.extra["connection_string"],
            "SampleHubs": processes.eventhubs_connection_string(hubs.port, "web"),
            "SAMPLE_HUB": "web",
            "SAMPLE_GROUP": "$Default",
            "TICK_SCHEDULE": "* * * * * *",
        },
        keys={"host": {"default": KEY}},
    )
    runner = start_runner(files, "tests.functions.sample_app")
    try:
        yield runner, files
    finally:
        runner.stop()
        hubs.stop()


def call(
    runner: processes.Server,
    method: str,
    path: str,
    headers: Optional[Dict[str, str]] = None,
    body: Optional[bytes] = None,
) -> Tuple[int, bytes, Dict[str, str]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{runner.port}{path}", data=body, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def test_http_route_with_key_header_reaches_the_function(web_runner) -> None:
    runner, _ = web_runner
    status, body, headers = call(runner, "POST", "/api/echo/vm7?x=1", {"x-functions-key": KEY}, b"payload")
    assert status == 201
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(body) == {"name": "vm7", "query": {"x": "1"}, "body": "payload", "method": "POST"}


def test_http_code_query_parameter_is_a_key_and_is_not_passed_on(web_runner) -> None:
    runner, _ = web_runner
    status, body, _ = call(runner, "GET", f"/api/echo/a%20b?code={KEY}")
    assert status == 201
    assert json.loads(body)["name"] == "a b"
    assert json.loads(body)["query"] == {}


@pytest.mark.parametrize("headers", [{}, {"x-functions-key": "wrong"}], ids=["no key", "wrong key"])
def test_http_without_a_valid_key_is_401(web_runner, headers: Dict[str, str]) -> None:
    runner, _ = web_runner
    status, _, _ = call(runner, "GET", "/api/echo/vm1", headers)
    assert status == 401


def test_anonymous_route_needs_no_key(web_runner) -> None:
    runner, _ = web_runner
    status, body, _ = call(runner, "GET", "/api/open")
    assert (status, body) == (200, b"open")


@pytest.mark.parametrize("path", ["/api/nothing", "/api/echo", "/echo/vm1", "/api/echo/vm1/more"])
def test_unknown_route_is_404(web_runner, path: str) -> None:
    runner, _ = web_runner
    status, _, _ = call(runner, "GET", path, {"x-functions-key": KEY})
    assert status == 404


def test_method_not_in_the_binding_is_405(web_runner) -> None:
    runner, _ = web_runner
    status, _, headers = call(runner, "DELETE", "/api/echo/vm1", {"x-functions-key": KEY})
    assert status == 405
    assert headers["Allow"] == "GET, POST"


def test_timer_fires_on_its_ncrontab_schedule(web_runner) -> None:
    runner, files = web_runner
    ticks = wait_until(
        lambda: [r for r in files.read_records() if r["function"] == "tick"][2:],
        15,
        "three timer invocations",
        runner,
    )
    assert all(isinstance(t["past_due"], bool) for t in ticks)


def test_runner_logs_each_loaded_function_and_invocation(web_runner) -> None:
    runner, _ = web_runner
    call(runner, "GET", "/api/open")
    assert runner.log_path is not None
    log = wait_until(
        lambda: (lambda t: t if "Executed 'Functions.open_route' (Succeeded" in t else "")(
            runner.log_path.read_text()
        ),
        10,
        "the invocation log line",
        runner,
    )
    for name, kind in [
        ("collect", "eventHubTrigger"),
        ("tick", "timerTrigger"),
        ("echo", "httpTrigger"),
        ("open_route", "httpTrigger"),
    ]:
        assert f"Loaded function {name}: {kind}" in log
