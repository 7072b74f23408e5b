"""One Linux VM of the tests: a booted Debian root, the forwarder installed in it exactly as the
CustomScript extension installs it (infra/forwarder/install-vm.bicep: `bash install-forwarder.sh --bundle
se-forwarder-linux.tar.gz --config-base64 <config>`, from the extension's download directory), and what
the checks read back: the unit's state, the journal, the simulator's record of the VM's approvals.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, TypeVar

from sandbox import processes
from sandbox.demo.fleet import HUB, Fleet

from .container import Container

VM = "vm-linux"
UNIT = "se-forwarder.service"
DOWNLOAD_DIR = "/var/lib/waagent/custom-script/download/0"  # where the extension runs the command
T = TypeVar("T")


def vm_config(fleet: Fleet, **extra: Any) -> Dict[str, Any]:
    """config.bicep's settings for this VM, pointed at the sandbox (connection strings: sandbox only)."""
    assert fleet.imds is not None
    return {"sink": "eventhub", "eventhub_name": HUB, "client_id": "", "queue_service_uri": "",
            "queue_client_id": "", "state_dir": "/var/lib/se-forwarder",
            "hook_dir": "/etc/se-forwarder/hooks",
            "authenticate": True,
            "eventhub_connection_string": processes.eventhubs_connection_string(
                fleet.servers["eventhubs"].port, HUB),
            "queue_connection_string": fleet.storage, "imds_url": fleet.imds.vm_url(VM),
            "heartbeat_interval": 3, "approval_visibility_timeout": 60, "hook_timeout": 20,
            "log_level": "debug", **extra}


def install(vm: Container, fleet: Fleet, artifacts: str = "/mnt/artifacts", check: bool = True,
            **extra: Any) -> subprocess.CompletedProcess:
    """The extension's steps: download (copy) the script and the bundle, run the command as root."""
    config = base64.b64encode(json.dumps(vm_config(fleet, **extra)).encode()).decode()
    vm.sh(f"rm -rf {DOWNLOAD_DIR} && mkdir -p {DOWNLOAD_DIR} && "
          f"cp {artifacts}/install-forwarder.sh {artifacts}/se-forwarder-linux.tar.gz {DOWNLOAD_DIR}/")
    return vm.run("sh", "-c", f"cd {DOWNLOAD_DIR} && bash install-forwarder.sh --bundle "
                  f"se-forwarder-linux.tar.gz --config-base64 {config}", check=check, timeout=400)


def wait_for(what: str, probe: Callable[[], Optional[T]], timeout: float = 60.0, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def main_pid(vm: Container) -> int:
    return int(vm.show(UNIT, "MainPID")["MainPID"])


def wait_running(vm: Container, timeout: float = 60.0) -> int:
    """The service active with a main process. Returns that PID."""
    return wait_for("se-forwarder active", lambda: main_pid(vm) if vm.show(UNIT, "ActiveState")[
        "ActiveState"] == "active" else 0, timeout)


def add_event(fleet: Fleet, **spec: Any) -> str:
    assert fleet.imds is not None
    return str(fleet.imds.add_event(resources=[VM], **spec)["eventId"])


def posts(fleet: Fleet, event_id: str) -> List[Dict[str, Any]]:
    """The VM's POSTs to IMDS that start `event_id`, as the simulator recorded them."""
    assert fleet.imds is not None
    found = []
    for request in fleet.imds.requests(vm=VM, method="POST"):
        try:
            ids = [r["EventId"] for r in json.loads(request.get("body") or "{}").get("StartRequests", [])]
        except (ValueError, AttributeError, TypeError):
            continue
        if event_id in ids:
            found.append(request)
    return found


def wait_approved(fleet: Fleet, event_id: str, timeout: float = 90.0) -> Dict[str, Any]:
    assert fleet.imds is not None
    imds = fleet.imds
    return wait_for(f"{event_id} approved by {VM}",
                    lambda: (lambda e: e if e.get("approvedBy") else None)(imds.event(event_id)), timeout)


def journal_json(vm: Container, message: Optional[str] = None, pid: int = 0) -> List[Dict[str, Any]]:
    """The forwarder's JSON log lines in the journal (message `message` only, process `pid` only)."""
    out = vm.run("journalctl", "-u", UNIT, "-o", "json", "--no-pager", check=False).stdout
    entries = []
    for line in out.splitlines():
        try:
            record = json.loads(line)
            entry = json.loads(record.get("MESSAGE") or "")
        except (ValueError, TypeError):
            continue
        if not isinstance(entry, dict) or (message is not None and entry.get("msg") != message):
            continue
        if pid and record.get("_PID") != str(pid):
            continue
        entries.append(entry)
    return entries
