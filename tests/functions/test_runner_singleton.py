"""Timer triggers as singletons (the host's listener lock, a blob lease in AzureWebJobsStorage): two
runners of one app on one storage account never run the timer at once, and when the holder is killed
(SIGKILL by PID, no release) the other takes the timer over once the lease has run out."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List

from azure.storage.blob import BlobServiceClient

from sandbox import processes
from sandbox.functions.hostconfig import SingletonOptions
from sandbox.functions.singleton import HOSTS_CONTAINER, listener_lock_blob

from .conftest import REPO, RunnerFiles, start_runner, wait_until

# The host's minimum lease and recovery poll (15 s each; the defaults are 60 s and 60 s).
SINGLETON = {"listenerLockPeriod": "00:00:15", "listenerLockRecoveryPollingInterval": "00:00:15"}


def ticks(files: RunnerFiles) -> List[Dict[str, Any]]:
    return [r for r in files.read_records() if r["function"] == "tick"]


def lease_state(storage: str, host_id: str) -> str:
    service = BlobServiceClient.from_connection_string(storage)
    blob = service.get_blob_client(HOSTS_CONTAINER, listener_lock_blob(host_id, "tick"))
    return str(blob.get_blob_properties().lease.state)


def test_two_runners_never_run_the_timer_at_once_and_the_survivor_takes_it_over(
    azurite: processes.Server, eventhubs_server: processes.Server, tmp_path: Path
) -> None:
    storage = azurite.extra["connection_string"]
    host_id = f"singleton-{uuid.uuid4().hex[:16]}"  # this test's app: no other test's lock
    host = {**json.loads((REPO / "host.json").read_text()), "singleton": SINGLETON}
    options = SingletonOptions.from_mapping(SINGLETON)
    fastest, slowest = options.takeover_seconds()
    hub = processes.eventhubs_connection_string(eventhubs_server.port, "scheduled-events")
    runners: Dict[str, processes.Server] = {}
    files = {name: RunnerFiles(tmp_path / name) for name in ("a", "b")}
    try:
        for name, f in files.items():
            f.write({"AzureWebJobsStorage": storage, "AzureFunctionsWebHost__hostid": host_id,
                     "SampleHubs": hub, "SAMPLE_HUB": "scheduled-events",
                     "SAMPLE_GROUP": "$Default", "TICK_SCHEDULE": "* * * * * *", "TICK_SECONDS": "0.4"},
                    host=host)
            runners[name] = start_runner(f, "tests.functions.sample_app")
        # one runner ticks every second; the other never does while the first holds the lease
        holder = wait_until(lambda: next((n for n, f in files.items() if len(ticks(f)) >= 3), None),
                            30, "three ticks on one runner", runners["a"])
        standby = "b" if holder == "a" else "a"
        time.sleep(3)
        assert ticks(files[standby]) == [], "both runners ran the timer"
        assert lease_state(storage, host_id) == "leased"
        killed_at = time.time()
        runners[holder].kill()  # SIGKILL: the lease is neither released nor renewed any more
        first = wait_until(lambda: ticks(files[standby])[:1], slowest + 20,
                           "the standby's first tick after the kill", runners[standby])[0]
        wait_until(lambda: len(ticks(files[standby])) >= 3, 15, "the standby ticking", runners[standby])
        runners[standby].stop()  # graceful: the invocation finishes, then the lease is released
        released = lease_state(storage, host_id)
    finally:
        for r in runners.values():
            r.stop()
    takeover = first["started"] - killed_at
    print(f"takeover {takeover:.1f} s after the kill (lease 15 s, recovery poll 15 s: "
          f"{fastest:.1f}..{slowest:.1f} s)")
    # the lease, not the death, decides: never before it could have run out, never after the next poll
    assert fastest - 1 <= takeover <= slowest + 5, takeover
    before = ticks(files[holder])
    after = ticks(files[standby])
    assert {t["pid"] for t in before} == {runners[holder].pid}
    assert {t["pid"] for t in after} == {runners[standby].pid}
    # never at once: every tick of the holder ended before any of the standby's began
    assert max(t["ended"] for t in before) < min(t["started"] for t in after)
    assert released == "available", "a stopping runner releases its lease"
