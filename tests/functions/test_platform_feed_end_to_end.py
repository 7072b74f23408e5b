"""Issue 23, point 6: Azure's side in the sandbox. The IMDS simulator's fabric publishes each event's
transitions as system-topic events (azure-eventhub SDK) into the sandbox Event Hubs' platform hub; the real
function_app.py in the runner reads them with its `platform` trigger; central's event view shows what the
platform said. No forwarder runs: the platform is the only witness. Run once clean and once with every feed
fault on (duplicates, reordering, delay)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from sandbox import processes
from sandbox.functions.issuer import LocalIssuer

from .conftest import RunnerFiles, start_runner, wait_until
from .test_end_to_end import KEY, get

PREFIX = "platform"


class World:
    def __init__(self, imds: processes.Server, runner: processes.Server, mode: str) -> None:
        self.imds, self.runner, self.mode = imds, runner, mode

    def admin(self, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(f"http://127.0.0.1:{self.imds.port}/admin/{path}", data=data,
                                         method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def event(self, event_id: str) -> Optional[Dict[str, Any]]:
        status, view = get(self.runner, f"/api/events/{event_id}")
        return view if status == 200 and isinstance(view, dict) else None

    def said(self, event_id: str) -> List[str]:
        view = self.event(event_id) or {}
        platform = (view.get("witnesses") or {}).get("platform") or {}
        return [t["said"] for t in platform.get("transitions", [])]


@pytest.fixture(params=["clean", "faults"])
def world(request: pytest.FixtureRequest, azurite: processes.Server, tmp_path: Path) -> Iterator[World]:
    hub = processes.start_eventhubs(log_dir=tmp_path)
    feed = processes.eventhubs_connection_string(hub.port, processes.PLATFORM_HUB)
    faults = ["--platform-duplicates", "--platform-reorder", "--platform-delay", "0.5"] \
        if request.param == "faults" else []
    imds = processes.start_imds(["--vm", "web_0", "--vm", "web_1", "--time-scale", "60",
                                 "--platform-feed", feed, *faults], log_dir=tmp_path)
    storage = azurite.extra["connection_string"]
    files = RunnerFiles(tmp_path / "central")
    files.write({"AzureWebJobsStorage": storage, "ApprovalStorage": storage,
                 **processes.central_hub_settings(hub.port), "EVENTHUB_CONSUMER_GROUP": "platform-e2e",
                 "TABLE_PREFIX": PREFIX + request.param, "POLICY_JSON": "", "ALERT_WEBHOOK_URL": "",
                 "ALERT_WEBHOOK_FORMAT": "generic", "REEVALUATE_SCHEDULE": "*/2 * * * * *"},
                keys={"host": {"default": KEY}},
                auth=LocalIssuer(tmp_path / "central" / "issuer").init().auth_section())
    runner = start_runner(files, "function_app")
    try:
        yield World(imds, runner, request.param)
    finally:
        runner.stop()
        imds.stop()
        hub.stop()


def test_the_fabric_s_transitions_reach_central_as_the_platform_s_word(world: World) -> None:
    cancelled = world.admin("events", {"eventType": "Reboot", "resources": ["web_0"], "eventId": "P-CANCEL"})
    done = world.admin("events", {"eventType": "Freeze", "resources": ["web_0", "web_1"], "eventId": "P-DONE",
                                  "startedSeconds": 120})
    assert cancelled["state"] == done["state"] == "Scheduled"
    wait_until(lambda: world.event("P-CANCEL") and world.event("P-DONE"), 30, "both events in central",
               world.runner)
    world.admin("events/P-CANCEL/cancel")
    world.admin("events/P-DONE/start")  # Started, then Completed 120 simulated (2 real) seconds later
    ended = wait_until(lambda: (lambda v: v if v and v["status"] == "Cancelled" else None)(
        world.event("P-CANCEL")), 30, "the platform's Canceled", world.runner)
    assert ended["witnesses"]["platform"]["said"] == "Canceled" and ended["history"][-1]["said"] == "Canceled"
    assert ended["reportedBy"] == {}  # no forwarder: the platform is the only witness
    completed = wait_until(lambda: (lambda v: v if v and v["status"] == "Completed" else None)(
        world.event("P-DONE")), 30, "the platform's Completed", world.runner)
    statuses = [h["status"] for h in completed["history"]]
    assert statuses[-1] == "Completed" and set(statuses) <= {"Scheduled", "Started", "Completed"}
    assert completed["resources"] == ["web_0", "web_1"]
    owner = completed["witnesses"]["platform"]["owner"]
    assert (owner["kind"], owner["name"]) == ("virtualMachines", "web_0")
    # duplicates are recognised by their Event Grid id: each transition is recorded once
    assert sorted(world.said("P-DONE")) == ["Completed", "Scheduled", "Started"]
    log = world.runner.log_path.read_text() if world.runner.log_path else ""
    assert "Executed 'Functions.platform' (Failed" not in log
    counted = re.findall(r"platform: \d+ received, \d+ processed, (\d+) duplicates", log)
    duplicates = sum(int(n) for n in counted)
    stale = sum(int(n) for n in re.findall(r"platform: .* (\d+) stale", log))
    if world.mode == "faults":
        assert duplicates == 5  # every one of the five transitions was sent twice
    else:
        assert duplicates == 0 and stale == 0
