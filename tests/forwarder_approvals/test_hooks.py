"""forwarder.hooks: real executables, real processes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from forwarder import hooks

from .helpers import write_hook

EVENT = {"EventId": "E-1", "EventType": "Redeploy", "EventStatus": "Scheduled", "Resources": ["vm0", "vm1"],
         "NotBefore": "Mon, 11 Apr 2022 22:26:58 GMT", "Description": "drain me", "EventSource": "Platform",
         "DurationInSeconds": -1, "ResourceType": "VirtualMachine"}


def _settings(tmp_path: Path, timeout: float = 5.0, limit: int = 4096) -> hooks.HookSettings:
    return hooks.HookSettings(hook_dir=str(tmp_path), timeout_seconds=timeout, output_limit=limit)


def test_event_details_in_environment_and_name_order(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    write_hook(tmp_path, "pre-approve", "20-second", f'echo "second $SE_EVENT_ID" >> {out}')
    write_hook(tmp_path, "pre-approve", "10-first",
               f'echo "first $SE_EVENT_ID|$SE_EVENT_TYPE|$SE_EVENT_STATUS|$SE_NOT_BEFORE|'
               f'$SE_DURATION_SECONDS|$SE_RESOURCES|$SE_EVENT_SOURCE|$SE_DESCRIPTION|$SE_VM_NAME|'
               f'$SE_VM_ID|$SE_HOOK_PHASE|${{SE_FORWARDER_QUEUE_CONNECTION_STRING:-unset}}" >> {out}')
    os.environ["SE_FORWARDER_QUEUE_CONNECTION_STRING"] = "secret-must-not-leak"
    try:
        env = hooks.event_environment(EVENT, "vm0", "id-0")
        run = hooks.run_phase(hooks.PRE_APPROVE, env, _settings(tmp_path))
    finally:
        del os.environ["SE_FORWARDER_QUEUE_CONNECTION_STRING"]
    assert run.ok and run.ran == 2
    lines = out.read_text().splitlines()
    assert lines == ["first E-1|Redeploy|Scheduled|Mon, 11 Apr 2022 22:26:58 GMT|-1|vm0 vm1|Platform|"
                     "drain me|vm0|id-0|pre-approve|unset", "second E-1"]


def test_failure_stops_pre_approve_and_reports_exit_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    write_hook(tmp_path, "pre-approve", "10-fail", "echo draining failed; exit 3")
    write_hook(tmp_path, "pre-approve", "20-never", f"touch {marker}")
    run = hooks.run_phase(hooks.PRE_APPROVE, {"SE_EVENT_ID": "E"}, _settings(tmp_path))
    assert not run.ok
    assert run.results[0].exitCode == 3 and "draining failed" in run.results[0].output
    assert "10-fail exited 3" in run.failure()
    assert not marker.exists()


def test_post_event_runs_every_hook_even_after_a_failure(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    write_hook(tmp_path, "post-event", "10-fail", "exit 1")
    write_hook(tmp_path, "post-event", "20-still", f"touch {marker}")
    run = hooks.run_phase(hooks.POST_EVENT, {}, _settings(tmp_path))
    assert not run.ok and marker.exists()


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    write_hook(tmp_path, "pre-approve", "slow", f"sleep 30 & echo $! > {pidfile}; wait")
    run = hooks.run_phase(hooks.PRE_APPROVE, {}, _settings(tmp_path, timeout=0.5))
    (result,) = run.results
    assert result.timedOut and not run.ok and "timed out" in run.failure()
    child = int(pidfile.read_text())
    for _ in range(50):  # reaped by init: bounded wait until it is gone
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"


def test_output_truncated(tmp_path: Path) -> None:
    write_hook(tmp_path, "pre-approve", "chatty", "head -c 10000 /dev/zero | tr '\\0' x")
    run = hooks.run_phase(hooks.PRE_APPROVE, {}, _settings(tmp_path, limit=100))
    (result,) = run.results
    assert run.ok and result.outputTruncated and result.output == "x" * 100


def test_world_writable_hook_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = write_hook(tmp_path, "pre-approve", "open", f"touch {marker}")
    os.chmod(path, 0o777)  # noqa: S103 - the point of the test
    run = hooks.run_phase(hooks.PRE_APPROVE, {}, _settings(tmp_path))
    assert not run.ok and "writable" in run.failure() and not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_hook_owned_by_another_user_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = write_hook(tmp_path, "pre-approve", "theirs", f"touch {marker}")
    os.chown(path, 65534, 65534)
    run = hooks.run_phase(hooks.PRE_APPROVE, {}, _settings(tmp_path))
    assert not run.ok and "owned by uid 65534" in run.failure() and not marker.exists()


def test_symlink_refused_and_non_executable_skipped(tmp_path: Path) -> None:
    target = write_hook(tmp_path, "pre-approve", "real", "exit 0")
    (tmp_path / "pre-approve.d" / "link").symlink_to(target)
    (tmp_path / "pre-approve.d" / "README").write_text("docs, not a hook")
    run = hooks.run_phase(hooks.PRE_APPROVE, {}, _settings(tmp_path))
    assert run.skipped == ["README"]
    assert [r.name for r in run.results] == ["link"] and "symlink" in run.failure()


def test_no_hook_directory_is_an_empty_successful_run(tmp_path: Path) -> None:
    run = hooks.run_phase(hooks.POST_EVENT, {}, _settings(tmp_path / "missing"))
    assert run.ok and run.ran == 0


def test_writable_hook_directory_refused(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    write_hook(tmp_path, "pre-approve", "ok", f"touch {marker}")
    os.chmod(tmp_path / "pre-approve.d", 0o777)  # noqa: S103 - the point of the test
    run = hooks.run_phase(hooks.PRE_APPROVE, {}, _settings(tmp_path))
    assert not run.ok and "writable" in run.failure() and not marker.exists()
