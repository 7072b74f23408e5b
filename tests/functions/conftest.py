"""Helpers to run the sandbox Functions runner as a child process against the real stand-ins."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from sandbox import processes

REPO = processes.REPO


@dataclass
class RunnerFiles:
    """Where one runner's settings, host.json, log and records live."""

    directory: Path

    @property
    def settings(self) -> Path:
        return self.directory / "local.settings.json"

    @property
    def host_json(self) -> Path:
        return self.directory / "host.json"

    @property
    def records(self) -> Path:
        return self.directory / "records.jsonl"

    def write(
        self,
        values: Dict[str, str],
        keys: Optional[Dict[str, Any]] = None,
        host: Optional[Dict[str, Any]] = None,
        auth: Optional[Dict[str, Any]] = None,
    ) -> None:
        """`auth`: the runner's App Service authentication ("Auth" section; sandbox/functions/easyauth.py)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        values = {"FUNCTIONS_WORKER_RUNTIME": "python", "RECORD_FILE": str(self.records), **values}
        document = {"IsEncrypted": False, "Values": values, "Keys": keys or {}}
        if auth is not None:
            document["Auth"] = auth
        self.settings.write_text(json.dumps(document))
        if host is not None:
            self.host_json.write_text(json.dumps(host))

    def read_records(self) -> List[Dict[str, Any]]:
        if not self.records.exists():
            return []
        return [json.loads(line) for line in self.records.read_text().splitlines() if line.strip()]


HOLD_ALL = {"version": 1, "rules": [{"name": "manual", "action": "hold"}]}


@contextmanager
def central_backends(work: Path, group: str, prefix: str,
                     policy: Optional[Dict[str, Any]] = None) -> Iterator[Dict[str, str]]:
    """Azurite and an Event Hubs server for a central app, stopped on exit; yields the app settings
    (consumer group `group`, tables `prefix`, `policy` or hold-everything, no webhook, a timer that
    never fires in a test)."""
    azurite = processes.start_azurite(log_dir=work)
    hub = processes.start_eventhubs(("scheduled-events=2", f"{processes.PLATFORM_HUB}=1"), log_dir=work)
    storage = azurite.extra["connection_string"]
    try:
        yield {
            "AzureWebJobsStorage": storage, "ApprovalStorage": storage,
            **processes.central_hub_settings(hub.port),
            "EVENTHUB_NAME": "scheduled-events", "EVENTHUB_CONSUMER_GROUP": group, "TABLE_PREFIX": prefix,
            "POLICY_JSON": json.dumps(policy or HOLD_ALL),
            "ALERT_WEBHOOK_URL": "", "ALERT_WEBHOOK_FORMAT": "generic", "REEVALUATE_SCHEDULE": "0 0 0 1 1 *",
        }
    finally:
        hub.stop()
        azurite.stop()


def start_runner(files: RunnerFiles, app: str, port: Optional[int] = None) -> processes.Server:
    """`python -m sandbox.functions` on a free loopback port, logs in files.directory/functions.log."""
    port = port or processes.free_port()
    argv = [
        sys.executable,
        "-m",
        "sandbox.functions",
        "--settings",
        str(files.settings),
        "--app",
        app,
        "--app-dir",
        str(REPO),
        "--port",
        str(port),
    ]
    if files.host_json.exists():
        argv += ["--host-json", str(files.host_json)]
    return processes.start("functions", argv, {"http": port}, log_dir=files.directory, timeout=60)


def wait_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    server: Optional[processes.Server] = None,
    interval: float = 0.2,
) -> Any:
    """Poll `condition` (bounded in time) until it returns something truthy; fail with the runner's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if server is not None and server.proc.poll() is not None:
            break
        time.sleep(interval)
    log = server.log_path.read_text()[-4000:] if server is not None and server.log_path else ""
    pytest.fail(f"timed out waiting for {what}\n--- runner log ---\n{log}")


@pytest.fixture
def runner_files(tmp_path: Path) -> RunnerFiles:
    return RunnerFiles(tmp_path / "runner")


@pytest.fixture(scope="module")
def coverage_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """The coverage stack (tests/functions/coverage_world.py): central, IMDS, the Resource Graph stand-in."""
    from .coverage_world import coverage_stack  # it imports this module's helpers

    with coverage_stack(tmp_path_factory.mktemp("coverage")) as env:
        yield env
