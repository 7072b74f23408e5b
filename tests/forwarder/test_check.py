"""`se-forwarder check`: every line (ok / warn / fail) against the real services, and its exit code.

In process (`check.check(config, as_json=True)`) against the IMDS simulator, the sandbox Event Hubs
server and Azurite; `test_forwarder_process.py` runs it as a process too."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from forwarder import check, exitcodes
from forwarder import config as cfg
from forwarder.approvals.naming import queue_name
from sandbox import processes

from .helpers import imds_url


@pytest.fixture(scope="module")
def imds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    server = processes.start_imds(["--time-scale", "60", "--rate-limit", "0"],
                                  log_dir=tmp_path_factory.mktemp("imds"))
    yield server
    server.stop()


def run_check(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: Dict[str, Any],
              env: Dict[str, str] | None = None) -> Dict[str, Any]:
    config_file = tmp_path / "config.json"
    config_file.write_text("{}")
    hooks = tmp_path / "hooks"
    hooks.mkdir(mode=0o755, exist_ok=True)
    base = {"config": str(config_file), "state_dir": str(tmp_path / "state"), "hook_dir": str(hooks),
            "sink": "file", "sink_file": str(tmp_path / "out.jsonl")}
    config = cfg.load({**base, **flags}, env or {})
    code = check.check(config, as_json=True)
    report = json.loads(capsys.readouterr().out)
    assert report["exitCode"] == code
    return report


def lines(report: Dict[str, Any], name: str) -> List[Dict[str, Any]]:
    return [c for c in report["checks"] if c["name"] == name]


def statuses(report: Dict[str, Any]) -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = {}
    for c in report["checks"]:
        found.setdefault(c["name"], []).append(c["status"])
    return found


def test_all_ok_with_a_file_sink(imds: processes.Server, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    hook = tmp_path / "hooks" / "pre-approve.d" / "10-drain"
    hook.parent.mkdir(parents=True)
    hook.write_text("#!/bin/sh\nexit 0\n")
    executable = 0o755  # root-owned, not group/world-writable: what the runner accepts
    os.chmod(hook, executable)
    os.chmod(hook.parent, executable)
    report = run_check(tmp_path, capsys, {"imds_url": imds_url(imds)})
    assert report["exitCode"] == 0, report["checks"]
    assert statuses(report) == {"config": ["ok"], "state": ["ok"], "outbox": ["ok"], "identity": ["ok"],
                                "imds": ["ok"], "clock": ["ok"], "sink": ["ok"], "approvals": ["ok"],
                                "hooks": ["ok", "ok"]}
    assert "10-drain" in lines(report, "hooks")[0]["detail"]
    assert not (tmp_path / "state").exists(), "check creates nothing"


def test_a_file_sink_that_names_a_directory_fails(imds: processes.Server, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`run` would retry its sends into a directory forever: `check` says so."""
    folder = tmp_path / "out"
    folder.mkdir()
    report = run_check(tmp_path, capsys, {"imds_url": imds_url(imds), "sink_file": str(folder)})
    (sink,) = lines(report, "sink")
    assert sink["status"] == "fail" and "is a directory" in sink["detail"]
    assert report["exitCode"] == exitcodes.CHECK_FAILED


def test_state_dir_that_cannot_be_written_fails_with_6(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        imds: processes.Server) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    report = run_check(tmp_path, capsys, {"imds_url": imds_url(imds), "state_dir": str(blocker / "state")})
    assert report["exitCode"] == exitcodes.STATE
    (state,) = lines(report, "state")
    assert state["status"] == "fail" and "is not a directory" in state["detail"]


def test_a_corrupt_and_a_set_aside_outbox_are_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        imds: processes.Server) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "outbox.sqlite3").write_bytes(b"this is not sqlite" * 100)
    (state / "outbox.sqlite3.corrupt-20260101T000000Z").write_bytes(b"old")
    report = run_check(tmp_path, capsys, {"imds_url": imds_url(imds)})
    assert report["exitCode"] == 0  # run would heal it (set it aside and start fresh)
    outbox = lines(report, "outbox")
    assert [o["status"] for o in outbox] == ["warn", "warn"]
    assert "set it aside" in outbox[0]["detail"] and "corrupt-20260101T000000Z" in outbox[1]["detail"]
    assert (state / "outbox.sqlite3").read_bytes().startswith(b"this is not"), "check changes nothing"


def test_a_failed_send_is_a_warning_with_the_outbox_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], imds: processes.Server) -> None:
    from forwarder.outbox import Outbox

    outbox = Outbox(tmp_path / "state")
    outbox.record_error("SinkError: hub unreachable")
    outbox.close()
    report = run_check(tmp_path, capsys, {"imds_url": imds_url(imds)})
    (line,) = lines(report, "outbox")
    assert line["status"] == "warn" and "hub unreachable" in line["detail"]
    assert report["outbox"]["backlog"] == 0 and report["outbox"]["lastErrorAt"]


@pytest.mark.parametrize(("suffix", "code"), [("/not-imds", exitcodes.IMDS_REJECTED)])
def test_imds_refusing_is_4(tmp_path: Path, capsys: pytest.CaptureFixture[str], imds: processes.Server,
                            suffix: str, code: int) -> None:
    report = run_check(tmp_path, capsys, {"imds_url": imds_url(imds) + suffix})
    assert report["exitCode"] == code and lines(report, "imds")[0]["status"] == "fail"
    assert lines(report, "approvals")[0]["status"] == "ok"  # none configured: nothing to check


def test_a_schema_check_process_that_cannot_start_fails_with_9(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], imds: processes.Server,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`run` checks each new document in a child process (forwarder.validation): check starts one too."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    report = run_check(tmp_path, capsys, {"imds_url": imds_url(imds)})
    assert report["exitCode"] == exitcodes.CHECK_FAILED
    (line,) = lines(report, "imds")
    assert line["status"] == "fail" and "could not run" in line["detail"] and "no-python" in line["detail"]
    assert lines(report, "identity")[0]["status"] == "ok"


def test_imds_down_is_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_check(tmp_path, capsys, {"imds_url": f"http://127.0.0.1:{processes.free_port()}"})
    assert report["exitCode"] == exitcodes.IMDS_UNAVAILABLE


def test_clock_lines() -> None:
    import email.utils
    import time

    def one(date: Any) -> Dict[str, Any]:
        report = check.Report()
        check._clock(date, report)
        (line,) = report.lines
        return {"status": line.status, "detail": line.detail, "code": line.code}

    assert one(email.utils.formatdate(time.time(), usegmt=True))["status"] == "ok"
    assert one(email.utils.formatdate(time.time() - 60, usegmt=True))["status"] == "warn"
    far = one(email.utils.formatdate(time.time() + 3600, usegmt=True))
    assert far["status"] == "fail" and far["code"] == exitcodes.CHECK_FAILED and "time sync" in far["detail"]
    assert one(None)["status"] == "warn" and one("yesterday")["status"] == "warn"


def test_event_hubs_link_and_the_queue_ok_then_unreachable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], imds: processes.Server,
        eventhubs_server: processes.Server, azurite: processes.Server) -> None:
    conn = processes.eventhubs_connection_string(eventhubs_server.port, "scheduled-events")
    queue = azurite.extra["connection_string"]
    flags = {"imds_url": imds_url(imds), "sink": "eventhub", "eventhub_connection_string": conn,
             "queue_connection_string": queue, "hook_timeout": "20", "approval_visibility_timeout": "60"}
    report = run_check(tmp_path, capsys, flags)
    (sink,) = lines(report, "sink")
    assert sink["status"] == "ok" and "sender link opened" in sink["detail"]
    assert "nothing sent" in sink["detail"]
    (approvals,) = lines(report, "approvals")
    assert approvals["status"] == "warn" and "does not exist yet" in approvals["detail"]  # central makes it
    from azure.storage.queue import QueueClient

    vm_id = report["identity"]["vmId"]
    client = QueueClient.from_connection_string(queue, queue_name(vm_id))
    client.create_queue()
    try:
        again = run_check(tmp_path, capsys, flags)
        assert lines(again, "approvals")[0]["status"] == "ok" and again["exitCode"] == 0
    finally:
        client.delete_queue()
        client.close()
    dead = f"http://127.0.0.1:{processes.free_port()}"
    no_hub = processes.eventhubs_connection_string(processes.free_port(), "h")
    no_queue = queue.replace(f"127.0.0.1:{azurite.ports['queue']}", dead[7:])
    broken = run_check(tmp_path, capsys, {**flags, "eventhub_connection_string": no_hub,
                                          "queue_connection_string": no_queue})
    assert broken["exitCode"] == exitcodes.CHECK_FAILED
    assert lines(broken, "sink")[0]["status"] == "fail" and lines(broken, "approvals")[0]["status"] == "fail"


def test_managed_identity_token_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     imds: processes.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", imds_url(imds))
    flags = {"imds_url": imds_url(imds), "queue_service_uri": f"https://127.0.0.1:{processes.free_port()}/acct"}
    report = run_check(tmp_path, capsys, flags)
    (identity,) = [c for c in lines(report, "identity") if "managed identity" in c["detail"]]
    assert identity["status"] == "ok" and "https://storage.azure.com/.default" in identity["detail"]
    assert lines(report, "approvals")[0]["status"] == "fail"  # nothing listens there
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://127.0.0.1:{processes.free_port()}")
    report = run_check(tmp_path, capsys, flags)
    (identity,) = [c for c in lines(report, "identity") if "managed identity" in c["detail"]]
    assert identity["status"] == "fail" and report["exitCode"] == exitcodes.CHECK_FAILED


def test_hook_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str], imds: processes.Server) -> None:
    from forwarder.hooks import install_examples

    install_examples(str(tmp_path / "hooks"))
    report = run_check(tmp_path, capsys, {"imds_url": imds_url(imds)})
    pre, post = lines(report, "hooks")
    assert pre["status"] == "warn" and "none installed" in pre["detail"]
    assert "50-drain.sh.example" in pre["detail"]
    assert post["status"] == "ok" and report["exitCode"] == 0
    strict = run_check(tmp_path, capsys, {"imds_url": imds_url(imds), "require_pre_approve_hook": "true"})
    assert lines(strict, "hooks")[0]["status"] == "fail" and strict["exitCode"] == exitcodes.CHECK_FAILED
    unsafe = tmp_path / "hooks" / "pre-approve.d" / "20-writable"
    unsafe.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(unsafe, 0o777)  # noqa: S103 - the unsafe hook under test
    refused = run_check(tmp_path, capsys, {"imds_url": imds_url(imds)})
    (bad,) = [c for c in lines(refused, "hooks") if c["status"] == "fail"]
    assert "20-writable would be refused: group- or world-writable" in bad["detail"]
    assert refused["exitCode"] == exitcodes.CHECK_FAILED


def test_human_lines(imds: processes.Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = tmp_path / "config.json"
    config_file.write_text("{}")
    config = cfg.load({"config": str(config_file), "imds_url": imds_url(imds),
                       "state_dir": str(tmp_path / "s"), "hook_dir": str(tmp_path / "none")}, {})
    assert check.check(config) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok    config")
    assert all(line.split()[0] in ("ok", "warn", "fail") for line in out)


def test_outbox_read_only_figures(tmp_path: Path) -> None:
    from forwarder.outbox import Outbox

    outbox = Outbox(tmp_path)
    outbox.put({"id": "x", "type": "t"}, state={"last_incarnation": 7})
    outbox.close()
    figures = check._read_outbox(tmp_path / "outbox.sqlite3")
    assert figures["backlog"] == 1 and figures["lastIncarnation"] == 7
    db = sqlite3.connect(tmp_path / "outbox.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 1
    db.close()
