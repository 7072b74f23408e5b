"""The forwarder on Python 3.9, the oldest a VM distro may bring: installed as a VM would install it
(the pinned VM lock + the package, into a fresh venv), then run against the IMDS simulator.

Skipped only when no Python 3.9 interpreter exists on the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from sandbox import processes

from .helpers import admin, imds_url, incarnations, wait_until

REPO = processes.REPO
VM_LOCK = REPO / "infra" / "forwarder" / "requirements-vm.txt"


def _python39() -> str:
    pyenv = Path.home() / ".pyenv" / "versions"
    for candidate in sorted(pyenv.glob("3.9*/bin/python3.9"), reverse=True) if pyenv.is_dir() else []:
        probe = subprocess.run([str(candidate), "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and "(3, 9)" in probe.stdout:
            return str(candidate)
    pytest.skip("no Python 3.9 interpreter on this machine")


@pytest.fixture(scope="module")
def venv39(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("py39") / "venv"
    subprocess.run([_python39(), "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for args in (["-r", str(VM_LOCK)], ["--no-deps", str(REPO)]):
        result = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
    yield venv


def test_check_and_run_on_python39(venv39: Path, tmp_path: Path) -> None:
    imds = processes.start_imds(["--time-scale", "600"], log_dir=tmp_path)
    try:
        config = tmp_path / "config.json"
        config.write_text("{}")
        state, sink = tmp_path / "state", tmp_path / "published.jsonl"
        common = ["--imds-url", imds_url(imds), "--state-dir", str(state), "--sink", "file",
                  "--sink-file", str(sink), "--config", str(config)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SE_FORWARDER_")}
        env.pop("PYTHONPATH", None)
        # cwd outside the repo: the installed package runs, not the source tree
        check = subprocess.run([str(venv39 / "bin" / "se-forwarder"), "check", "--json", *common],
                               cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
        assert check.returncode == 0, check.stderr[-2000:]
        report = json.loads(check.stdout)
        assert report["identity"]["name"] == "vm0"

        with open(tmp_path / "daemon.log", "wb") as log:
            daemon = subprocess.Popen([str(venv39 / "bin" / "se-forwarder"), "run", *common,
                                       "--poll-interval", "0.25"], cwd=tmp_path, stderr=log, env=env)
            try:
                wait_until(lambda: incarnations(sink), timeout=30, what="first incarnation")
                admin(imds, "POST", "events", {"eventType": "Reboot", "eventSource": "User"})
                wait_until(lambda: len(incarnations(sink)) >= 2, timeout=30, what="the Reboot's incarnation")
            finally:
                daemon.send_signal(signal.SIGTERM)
                assert daemon.wait(timeout=30) == 0
        published = incarnations(sink)
        assert published == sorted(set(published)), "each incarnation once, in order"
    finally:
        imds.stop()
