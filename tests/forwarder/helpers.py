"""Shared by the forwarder tests: the simulator's admin API, the forwarder as a real process."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import requests

from sandbox import processes

REPO = processes.REPO


def admin(server: processes.Server, method: str, path: str, body: Any = None) -> Any:
    """Call the simulator's admin API (fails the test on a non-2xx answer)."""
    url = f"http://{processes.LOOPBACK}:{server.port}/admin/{path.lstrip('/')}"
    resp = requests.request(method, url, json=body, timeout=10)
    assert resp.status_code < 300, f"{method} {path}: {resp.status_code} {resp.text}"
    return resp.json() if resp.text else None


def imds_url(server: processes.Server, vm: str = "vm0") -> str:
    return f"http://{processes.LOOPBACK}:{server.port}/vms/{vm}"


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, step: float = 0.1, what: str = "") -> Any:
    """Poll `predicate` until truthy (bounded); raise AssertionError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(step)


def read_published(path: Path) -> List[Dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def of_type(envelopes: Sequence[Dict[str, Any]], kind: str) -> List[Dict[str, Any]]:
    return [e for e in envelopes if e["type"] == f"scheduledevents.{kind}.v1"]


def incarnations(path: Path) -> List[int]:
    return [e["data"]["incarnation"] for e in of_type(read_published(path), "incarnation")]


def backlog(state_dir: Path) -> int:
    """Pending rows, read straight from the SQLite file (another process may hold it)."""
    db = sqlite3.connect(f"file:{state_dir / 'outbox.sqlite3'}?mode=ro", uri=True, timeout=10)
    try:
        return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
    finally:
        db.close()


class Forwarder:
    """`python -m forwarder run ...` as a child process, stopped by PID."""

    def __init__(self, url: str, state_dir: Path, sink_file: Path, extra: Sequence[str] = (),
                 env: Optional[Dict[str, str]] = None) -> None:
        self.state_dir = state_dir
        self.sink_file = sink_file
        self.log_path = state_dir.parent / f"forwarder-{state_dir.name}.log"
        config = state_dir.parent / "forwarder-config.json"
        config.write_text("{}")  # explicit and empty: a developer's /etc file never leaks in
        argv = [sys.executable, "-m", "forwarder", "run", "--imds-url", url, "--state-dir", str(state_dir),
                "--sink", "file", "--sink-file", str(sink_file), "--poll-interval", "0.25",
                "--heartbeat-interval", "30", "--config", str(config), *extra]
        self._argv = argv
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
        self._env.update(env or {})
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> Forwarder:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self._argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=self._log,
                                     env=self._env)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        rc = self.proc.wait(timeout=timeout)
        self._log.close()
        return rc

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._log.close()

    def logs(self) -> List[Dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line, "level": "raw"})
        return out


class ExpiringCredential:
    """Stands for the VM's credential at the REST clients' interface when a service refuses a token: an
    expired token first, a fresh one after `forget` (both the IMDS simulator's own, sandbox_token). The real
    credential's forget() is tested in tests/forwarder/test_credential.py."""

    def __init__(self, resource: str) -> None:
        from sandbox.imds.metadata import sandbox_token

        self.forgotten: List[str] = []
        ident = type("Ident", (), {"vmId": "vm-x", "resourceId": "/subscriptions/s/vm-x"})()
        now = int(time.time())
        self.tokens = [sandbox_token(ident, resource, now - 7200, lifetime=3600),
                       sandbox_token(ident, resource, now)]

    def get_token(self, scope: str) -> Any:
        from forwarder.credential import AccessToken

        return AccessToken(self.tokens[0], 0)

    def forget(self, scope: str) -> None:
        self.forgotten.append(scope)
        self.tokens.pop(0)
