"""The forwarder under a real systemd (Debian 12, systemd 252), installed by the real install-forwarder.sh
from the real bundle, as the CustomScript extension runs it, against central, the hub, Azurite and the
IMDS simulator on the host's loopback. One booted VM serves this file's tests; each leaves the service
running for the next.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from sandbox.demo.fleet import Fleet

from .conftest import Boot
from .container import Container
from .vm import (
    UNIT,
    add_event,
    install,
    journal_json,
    main_pid,
    posts,
    wait_approved,
    wait_for,
    wait_running,
)

SERVICE_USER = "se-forwarder"
INSTALL_OUTPUT: List[str] = []  # what install-forwarder.sh printed when the module's VM was installed


@pytest.fixture(scope="module")
def vm(boot: Boot, bundle_dir: Path, fleet: Fleet) -> Iterator[Container]:
    # with systemd's BPF firewall (test_ip_allow_list.py): the unit's IP allow list is enforced
    machine = boot("bookworm", binds={bundle_dir: "/mnt/artifacts"}, bpf_firewall=True)
    t0 = time.monotonic()
    done = install(machine, fleet)
    print(f"install-forwarder.sh: {time.monotonic() - t0:.1f} s")
    INSTALL_OUTPUT.append(done.stdout + done.stderr)
    yield machine


@pytest.fixture
def running(vm: Container) -> int:
    """The service is up (a test before may have stopped it): its main PID."""
    if vm.show(UNIT, "ActiveState")["ActiveState"] != "active":
        vm.run("systemctl", "restart", UNIT)
    return wait_running(vm)


def _owner(vm: Container, pid: int) -> str:
    return vm.run("stat", "-c", "%U", f"/proc/{pid}").stdout.strip()


def test_the_install_starts_the_service_as_its_own_user(vm: Container, running: int) -> None:
    (out,) = INSTALL_OUTPUT
    assert "done: se-forwarder.service is running" in out, out
    props = vm.show(UNIT, "User", "NRestarts", "UnitFileState", "ExecMainStartTimestamp")
    assert props["User"] == SERVICE_USER and props["UnitFileState"] == "enabled"
    assert props["NRestarts"] == "0", props  # it started once and stayed up (the 203/EXEC loop is gone)
    assert _owner(vm, running) == SERVICE_USER
    # the console script's first line names a path that exists (it named venv.new before)
    first = vm.run("head", "-n1", "/opt/se-forwarder/venv/bin/se-forwarder").stdout.strip()
    assert first.startswith("#!/opt/se-forwarder/venv-") and vm.run("test", "-x", first[2:], check=False
                                                                     ).returncode == 0, first
    verify = vm.run("systemd-analyze", "verify", UNIT, check=False)
    said = (verify.stdout + verify.stderr).strip()
    assert verify.returncode == 0 and not said, said
    live = vm.run("systemd-analyze", "security", "--no-pager", UNIT).stdout.splitlines()[-1]
    print(f"live exposure in Debian 12: {live}")


def test_journald_has_its_heartbeats(vm: Container, running: int) -> None:
    beats = wait_for("3 heartbeats in the journal", lambda: (lambda b: b if len(b) >= 3 else None)(
        [e for e in journal_json(vm, "heartbeat") if e.get("id")]), timeout=40)
    sent = {i for e in journal_json(vm, "sent") for i in e.get("ids", [])}
    assert {b["id"] for b in beats[:-1]} <= sent  # published to the hub, said in the journal
    syslog_id = vm.run("journalctl", "-u", UNIT, "-o", "json", "-n", "1", "--no-pager").stdout
    assert json.loads(syslog_id)["_UID"] == vm.run("id", "-u", SERVICE_USER).stdout.strip()


def test_an_event_goes_to_central_and_its_approval_comes_back_to_imds(fleet: Fleet, running: int) -> None:
    event_id = add_event(fleet, eventType="Reboot", eventSource="User", startedSeconds=15)
    event = wait_approved(fleet, event_id)
    assert event["approvedBy"] == ["vm-linux"]
    assert [p["status"] for p in posts(fleet, event_id)] == [200]
    decided = wait_for("central's record of the approval", lambda: [
        r for r in fleet.central(f"events/{event_id}").get("approvals", [])], timeout=20)
    assert decided[0]["action"] == "approve", decided


class _Drains(BaseHTTPRequestHandler):
    """What the VM's application would expose: POST /admin/drain (docs/approvals.md's example hook)."""
    seen: List[Dict[str, str]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.seen.append(json.loads(self.rfile.read(length) or b"{}"))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


HOOK = """#!/bin/sh
# What docs/approvals.md says a drain hook does: log with logger, ask the application to drain over HTTP
# on loopback, wait; exit 0 = approve.
set -eu
logger -t se-forwarder-hook "pre-approve: $SE_EVENT_TYPE $SE_EVENT_ID for $SE_VM_NAME"
/usr/bin/python3 - <<'PY'
import json, os, pwd, socket, urllib.request
def refused(attempt):  # what the unit's sandbox answers, seen from inside it
    try:
        attempt()
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return "allowed"
def link_local():  # a datagram: the IP firewall fails its send with EPERM, whatever the network does
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"probe", ("169.254.1.1", 9))
body = json.dumps({{"user": pwd.getpwuid(os.getuid()).pw_name, "event": os.environ["SE_EVENT_ID"],
                   "type": os.environ["SE_EVENT_TYPE"], "cwd": os.getcwd(),
                   "write /etc": refused(lambda: open("/etc/se-probe", "w")),
                   "state dir": refused(lambda: open("/var/lib/se-forwarder/hook-probe", "w").close()),
                   "link-local": refused(link_local)}})
urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:{port}/admin/drain", body.encode(),
                       {{"Content-Type": "application/json"}}), timeout=10).close()
PY
sleep 1
"""


@pytest.fixture
def drain_server() -> Iterator[int]:
    _Drains.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Drains)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_drain_hook_runs_as_the_service_user(vm: Container, fleet: Fleet, running: int,
                                               drain_server: int) -> None:
    hook = "/etc/se-forwarder/hooks/pre-approve.d/50-drain"
    vm.run("install", "-m", "0755", "-o", "root", "-g", "root", "/dev/stdin", hook,
           input=HOOK.format(port=drain_server))
    try:
        # the policy's drain-before-redeploy rule: approve-after-hook
        event_id = add_event(fleet, eventType="Redeploy", eventSource="Platform", startedSeconds=15)
        event = wait_approved(fleet, event_id)
        assert event["approvedBy"] == ["vm-linux"]
        assert [(d["user"], d["event"], d["type"], d["cwd"]) for d in _Drains.seen] == [
            (SERVICE_USER, event_id, "Redeploy", "/")]
        # the unit's sandbox holds for the hook: a read-only system but its state directory
        sandbox = {k: _Drains.seen[0][k] for k in ("write /etc", "state dir")}
        assert sandbox == {"write /etc": "Read-only file system", "state dir": "allowed"}, sandbox
        # the unit's IP allow list holds for the hook (link-local but IMDS is denied), while the forwarder
        # reaches IMDS, the hub and Azurite on loopback (this very approval)
        assert _Drains.seen[0]["link-local"] == "Operation not permitted", _Drains.seen[0]
        logged = vm.run("journalctl", "-t", "se-forwarder-hook", "-o", "cat", "--no-pager").stdout
        assert f"pre-approve: Redeploy {event_id} for vm-linux" in logged
        assert [p["status"] for p in posts(fleet, event_id)] == [200]
    finally:
        vm.run("rm", "-f", hook, "/var/lib/se-forwarder/hook-probe")


def _pending(vm: Container) -> List[List[str]]:
    """[id, type] of each envelope waiting in the outbox (read as root with the VM's own python3)."""
    script = ("import json, sqlite3\n"
              "c = sqlite3.connect('file:/var/lib/se-forwarder/outbox.sqlite3?mode=ro', uri=True)\n"
              "print(json.dumps([list(r) for r in c.execute('select id, type from outbox order by seq')]))")
    return json.loads(vm.run("python3", "-c", script).stdout)


def test_kill_9_is_restarted_and_the_outbox_loses_nothing(vm: Container, fleet: Fleet, running: int) -> None:
    hub = fleet.servers["eventhubs"]
    restarts = int(vm.show(UNIT, "NRestarts")["NRestarts"])
    os.kill(hub.pid, signal.SIGSTOP)  # the hub stops answering: what the forwarder sees waits in the outbox
    try:
        event_id = add_event(fleet, eventType="Reboot", eventSource="User", startedSeconds=15)
        pending = wait_for("the event's envelope in the outbox", lambda: (lambda rows: rows if any(
            "heartbeat" not in kind for _, kind in rows) else None)(_pending(vm)), timeout=30)
        vm.sh(f"kill -9 {running}")  # the shell's kill: minbase has no procps
        new_pid = wait_for("a new main PID",
                           lambda: (lambda p: p if p not in (0, running) else 0)(main_pid(vm)), timeout=30)
    finally:
        os.kill(hub.pid, signal.SIGCONT)
    assert int(vm.show(UNIT, "NRestarts")["NRestarts"]) == restarts + 1
    assert _owner(vm, new_pid) == SERVICE_USER
    ids = {i for i, _ in pending}
    wait_for("every envelope pending at the kill sent by the new process", lambda: ids <= {
        i for e in journal_json(vm, "sent", pid=new_pid) for i in e.get("ids", [])}, timeout=60)
    wait_approved(fleet, event_id)  # central heard the event from the outbox and approved it once
    assert [p["status"] for p in posts(fleet, event_id)] == [200]


def test_a_config_error_is_not_restarted_and_status_says_why(vm: Container, fleet: Fleet,
                                                              running: int) -> None:
    """The extension's command with a config the forwarder refuses (exit 2): the install waits, sees the
    service fail, and ends with exit 1 and why; systemd does not restart it; `systemctl status` says why."""
    config = "/etc/se-forwarder/config.json"
    good = vm.run("cat", config).stdout
    try:
        done = install(vm, fleet, check=False, poll_interval=0.01)  # below IMDS's floor (0.25 s): exit 2
        assert done.returncode == 1, done.stdout + done.stderr
        assert "does not stay up (state failed, last exit status 2" in done.stderr, done.stderr
        time.sleep(7)  # longer than RestartSec=5: a restart would have come by now
        props = vm.show(UNIT, "ActiveState", "ExecMainStatus", "NRestarts", "Result")
        assert props == {"ActiveState": "failed", "ExecMainStatus": "2", "NRestarts": "0",
                         "Result": "exit-code"}, props
        status = vm.run("systemctl", "status", "--no-pager", "-n", "20", UNIT, check=False).stdout
        assert "status=2" in status and "poll_interval" in status, status
        pid = vm.show(UNIT, "ExecMainPID")["ExecMainPID"]
        said = vm.run("journalctl", f"_PID={pid}", "-o", "cat", "--no-pager").stdout.splitlines()
        assert said and "poll_interval" in said[-1], said  # its last line says what to fix
    finally:
        vm.run("install", "-m", "0640", "-o", "root", "-g", SERVICE_USER, "/dev/stdin", config, input=good)
        vm.run("systemctl", "restart", UNIT)
