"""Faults that cannot heal end `run` with their own exit code, which the service managers do not restart;
broken state heals or ends with one line; the poller's conditional GETs. Real processes, real IMDS."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set

import pytest

from forwarder import exitcodes
from forwarder.imds_refusals import LIMIT, RefusalCounter
from sandbox import processes

from .helpers import Forwarder, admin, imds_url, incarnations, of_type, read_published, wait_until

REPO = processes.REPO
UNIT = REPO / "infra" / "forwarder" / "se-forwarder.service"
HOST = REPO / "infra" / "forwarder" / "run-forwarder.ps1"


def unit_directives() -> Dict[str, List[str]]:
    values: Dict[str, List[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def systemd_restarts(exit_code: int, directives: Dict[str, List[str]]) -> bool:
    """systemd's rule for a service that exited on its own (systemd.service(5)): with Restart=always it
    is restarted unless the code is listed in RestartPreventExitStatus."""
    listed = directives.get("RestartPreventExitStatus", [])
    prevented: Set[int] = {int(v) for line in listed for v in line.split()}
    return directives.get("Restart") == ["always"] and exit_code not in prevented


def run_forwarder(url: str, state: Path, extra: Sequence[str] = (), timeout: float = 120.0,
                  prefix: Sequence[str] = ()) -> subprocess.CompletedProcess:
    config = state.parent / "config.json"
    config.write_text("{}")
    argv = [*prefix, sys.executable, "-m", "forwarder", "run", "--config", str(config), "--imds-url", url,
            "--state-dir", str(state), "--sink", "file", "--sink-file", str(state.parent / "out.jsonl"),
            *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_the_unit_and_the_windows_host_do_not_restart_on_2_and_8() -> None:
    directives = unit_directives()
    assert directives["StartLimitIntervalSec"] == ["0"]  # otherwise it restarts forever
    assert not systemd_restarts(exitcodes.USAGE, directives)
    assert not systemd_restarts(exitcodes.IMDS_REFUSES, directives)
    for code in (exitcodes.OK, exitcodes.ERROR, exitcodes.STATE, exitcodes.IMDS_UNAVAILABLE):
        assert systemd_restarts(code, directives), code
    host = HOST.read_text()
    (listed,) = re.findall(r"\$NoRestart = @\(([^)]*)\)", host)
    assert {int(c) for c in listed.split(",")} == {exitcodes.USAGE, exitcodes.IMDS_REFUSES}
    assert "if ($NoRestart -contains $code)" in host


def test_a_path_imds_answers_404_to_ends_run_with_8_after_a_bounded_number_of_tries(
        imds_server: processes.Server, tmp_path: Path) -> None:
    started = time.monotonic()
    done = run_forwarder(imds_url(imds_server) + "/not-imds", tmp_path / "state", ["--poll-interval", "0.25"])
    took = time.monotonic() - started
    assert done.returncode == exitcodes.IMDS_REFUSES, done.stderr[-2000:]
    assert took < 90, took
    errors = [json.loads(line) for line in done.stderr.splitlines() if '"level": "error"' in line]
    assert any("Not retrying" in e["msg"] and "HTTP 404" in e["msg"] for e in errors), errors
    assert "Traceback" not in done.stderr
    assert not systemd_restarts(done.returncode, unit_directives())


def test_a_persistent_400_ends_run_with_8_and_a_transient_one_does_not(
        imds_server: processes.Server, tmp_path: Path) -> None:
    url = imds_url(imds_server)
    three = {"kind": "status", "status": 400, "count": 3, "path": "scheduledevents"}
    admin(imds_server, "POST", "faults", three)
    sink = tmp_path / "out.jsonl"
    fw = Forwarder(url, tmp_path / "state", sink).start()
    try:
        wait_until(lambda: incarnations(sink), timeout=60, what="the first incarnation after 3 refusals")
        assert fw.alive(), "fewer refusals than the limit in a row must not end run"
        admin(imds_server, "POST", "faults", {"kind": "status", "status": 400, "count": 1000})
        assert fw.proc is not None
        assert fw.proc.wait(timeout=90) == exitcodes.IMDS_REFUSES
    finally:
        if fw.alive():
            fw.terminate()
    admin(imds_server, "DELETE", "faults")


def test_an_outage_is_retried_not_fatal(tmp_path: Path) -> None:
    """Nobody listens: an outage, not a refusal. run keeps retrying (systemd would not even see it)."""
    nobody = f"http://127.0.0.1:{processes.free_port()}"
    fw = Forwarder(nobody, tmp_path / "state", tmp_path / "out.jsonl").start()
    try:
        time.sleep(8)
        assert fw.alive()
    finally:
        assert fw.terminate() == 0


def test_refusal_counter() -> None:
    counter = RefusalCounter()
    outcomes = [counter.record(s) for s in (404, 404, None, 404, 410, 400, 405)]
    assert outcomes == [False] * 7 and counter.count == 2
    counter.record(None)
    assert [counter.record(400) for _ in range(LIMIT)] == [False] * (LIMIT - 1) + [True]


# ---- broken state ------------------------------------------------------------------------------

def test_a_corrupt_outbox_is_set_aside_and_reported_in_the_first_heartbeat(
        imds_server: processes.Server, tmp_path: Path) -> None:
    state, sink = tmp_path / "state", tmp_path / "out.jsonl"
    state.mkdir()
    (state / "outbox.sqlite3").write_bytes(b"\x00garbage, not SQLite" * 200)
    fw = Forwarder(imds_url(imds_server), state, sink).start()
    try:
        beats = wait_until(lambda: of_type(read_published(sink), "heartbeat"), timeout=30, what="a heartbeat")
        assert fw.alive()
    finally:
        assert fw.terminate() == 0
    aside = beats[0]["data"]["outbox"]["setAside"]
    assert Path(aside["path"]).name.startswith("outbox.sqlite3.corrupt-")
    assert "not a database" in aside["error"]
    assert Path(aside["path"]).read_bytes().startswith(b"\x00garbage"), "kept for inspection"
    assert incarnations(sink) == [1]  # and forwarding went on
    assert any("corrupt" in line.get("msg", "") for line in fw.logs() if line.get("level") == "error")


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                    reason="needs root and setpriv: root without CAP_DAC_OVERRIDE meets the permission bits")
def test_a_read_only_state_dir_with_leftover_wal_is_exit_6_and_one_line(
        imds_server: processes.Server, tmp_path: Path) -> None:
    state = tmp_path / "state"
    fw = Forwarder(imds_url(imds_server), state, tmp_path / "out.jsonl").start()
    wait_until(lambda: (state / "outbox.sqlite3-wal").exists(), timeout=30, what="a WAL file")
    fw.kill()  # SIGKILL: the -wal and -shm stay behind
    assert (state / "outbox.sqlite3-wal").exists() and (state / "outbox.sqlite3-shm").exists()
    os.chmod(state, 0o555)  # noqa: S103 - read-only for its owner: the fault under test
    no_override = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    try:
        done = run_forwarder(imds_url(imds_server), state, prefix=no_override, timeout=60)
        config = tmp_path / "config.json"
        approve = subprocess.run([*no_override, sys.executable, "-m", "forwarder", "approve", "SOME-EVENT",
                                  "--config", str(config), "--imds-url", imds_url(imds_server),
                                  "--state-dir", str(state)], capture_output=True, text=True, timeout=60,
                                 cwd=REPO)
    finally:
        os.chmod(state, 0o755)  # noqa: S103 - back to the tmp_path default
    assert done.returncode == exitcodes.STATE, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "not writable" in json.loads(line)["msg"] and "Traceback" not in done.stderr
    assert approve.returncode == exitcodes.STATE, approve.stderr
    assert "approval ledger" in approve.stderr and "Traceback" not in approve.stderr


# ---- conditional GETs --------------------------------------------------------------------------

def test_the_forwarder_polls_with_if_none_match_and_skips_unchanged_documents(
        imds_server: processes.Server, tmp_path: Path) -> None:
    sink = tmp_path / "out.jsonl"
    fw = Forwarder(imds_url(imds_server), tmp_path / "state", sink).start()
    try:
        wait_until(lambda: incarnations(sink) == [1], what="incarnation 1")
        time.sleep(1.5)
        freeze = {"eventType": "Freeze", "noticeSeconds": 900}
        event_id = admin(imds_server, "POST", "events", freeze)["eventId"]
        wait_until(lambda: incarnations(sink) == [1, 2], what="incarnation 2")
        admin(imds_server, "POST", "faults", {"kind": "reset"})  # same content, lower number: must be seen
        wait_until(lambda: len(incarnations(sink)) == 3, what="the reset")
    finally:
        assert fw.terminate() == 0
    polls = admin(imds_server, "GET", "requests?vm=vm0&method=GET&path=scheduledevents")
    conditional = [p for p in polls if "If-None-Match" in p["headers"]]
    answered: Dict[int, int] = {}
    for p in conditional:
        answered[p["status"]] = answered.get(p["status"], 0) + 1
    assert answered.get(304, 0) >= 3, answered  # unchanged documents were not sent again
    assert "If-None-Match" not in polls[0]["headers"]  # the first poll has nothing to compare with
    resets = [e for e in of_type(read_published(sink), "incarnation") if e["data"]["reset"]]
    assert len(resets) == 1 and event_id in json.dumps(resets[0]["data"]["document"])


def _backlog(state: Path) -> Optional[int]:
    db = sqlite3.connect(f"file:{state / 'outbox.sqlite3'}?mode=ro", uri=True)
    try:
        return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
    finally:
        db.close()


def test_sigterm_during_the_retries_still_stops_cleanly(imds_server: processes.Server,
                                                        tmp_path: Path) -> None:
    fw = Forwarder(imds_url(imds_server) + "/not-imds", tmp_path / "state", tmp_path / "out.jsonl").start()
    time.sleep(2)
    assert fw.proc is not None
    fw.proc.send_signal(signal.SIGTERM)
    assert fw.proc.wait(timeout=30) in (0, exitcodes.IMDS_REFUSES)
    assert _backlog(tmp_path / "state") == 0
