"""One Windows "VM" for the module: Wine's prefix with the forwarder installed from the Windows bundle
the way install-forwarder.ps1 installs it (its Python steps: `windows-install stage`, `activate`),
pointed at central (the Functions runner), the Event Hubs server, Azurite and the IMDS simulator, all
real processes on loopback (sandbox.demo.fleet.Fleet starts them; the VM is agentless there, the
Windows forwarder is this suite's).

Nothing here skips: a machine that cannot run Wine fails the suite with what to install.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from forwarder import windows_install
from sandbox import processes
from sandbox.demo.fleet import HUB, Fleet, FleetSettings, VmSpec
from tools import embedded_python, wheelhouse

from . import wine

VM = "vm-w"
POLICY = {
    "version": 1,
    "description": "the Windows suite: drain (pre-approve hooks) before every platform event",
    "rules": [{"name": "drain-first", "match": {"eventTypes": ["Redeploy", "Reboot"]},
               "action": "approve-after-hook", "severity": "warning"}],
}
# The drain hook: runs `hostname` by name (Windows' own PATH: with the Linux search path it exits 9009,
# "Can't recognize 'hostname'"), records its output, fails a Reboot (exit 3), drains a Redeploy for 3 s.
# (`if errorlevel`, not `||`: Wine's cmd takes `prog > file || ...` as failed even when prog exits 0.)
HOOK = (
    "@echo off\r\n"
    "hostname\r\n"
    "if errorlevel 1 exit /b 9\r\n"
    'hostname > "%ProgramData%\\se-forwarder\\state\\hook-%SE_EVENT_ID%.txt"\r\n'
    'if /I "%SE_EVENT_TYPE%"=="Reboot" exit /b 3\r\n'
    # a drain that takes a while: the ledger race's operators act while the daemon waits for it
    'if /I "%SE_EVENT_TYPE%"=="Redeploy" "%ProgramFiles%\\se-forwarder\\python\\python.exe" -c '
    '"import time; time.sleep(3)"\r\n'
    "exit /b 0\r\n"
)
BUNDLE_SOURCES = ("forwarder", "schemas", "pyproject.toml", "infra/forwarder", "tools/wheelhouse.py",
                  "tools/embedded_python.py", "docs/forwarder.md")


@dataclass
class WindowsVm:
    fleet: Fleet
    bundle: Path                      # the unpacked se-forwarder-windows.zip
    where: windows_install.Layout     # C:\\... paths, as the install plan lays them out
    timings: Dict[str, float] = field(default_factory=dict)
    daemons: List[wine.Daemon] = field(default_factory=list)

    def local(self, windows_path: str) -> Path:
        return wine.linux_path(windows_path)

    def installer(self, *args: str, timeout: float = 600) -> str:
        """`windows-install ARGS` as install-forwarder.ps1 runs it: the bundle's interpreter, the
        forwarder's wheel on sys.path (nothing installed yet)."""
        (wheel,) = (self.bundle / "wheels").glob("scheduled_events_forwarder-*.whl")
        python = wine.windows_path(self.bundle / "python" / "python.exe")
        return wine.run([python, "-c", windows_install.BOOTSTRAP, wine.windows_path(wheel), *args],
                        timeout=timeout).stdout

    def python(self, *args: str, timeout: float = 300, check: bool = True):  # type: ignore[no-untyped-def]
        """The installed interpreter (C:\\Program Files\\se-forwarder\\python\\python.exe)."""
        return wine.run([self.where.python_exe, *args], timeout=timeout, check=check)

    def start_daemon(self, name: str) -> wine.Daemon:
        """The forwarder as the service host starts it (windows_install.daemon_command)."""
        daemon = wine.Daemon(windows_install.daemon_command(self.where),
                             self.fleet.work / f"{name}.log")
        self.daemons.append(daemon)
        return daemon




def _sources_digest() -> str:
    digest = hashlib.sha256()
    for name in BUNDLE_SOURCES:
        root = processes.REPO / name
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(processes.REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def windows_bundle() -> Path:
    """se-forwarder-windows.zip as tools/wheelhouse.py builds it, cached per source digest."""
    out = wine.CACHE / "bundles" / _sources_digest()
    bundle = out / "se-forwarder-windows.zip"
    with wine.locked("bundle"):
        if not bundle.exists():
            shutil.rmtree(out, ignore_errors=True)
            # with the [sdk] extra: this forwarder reaches the sandbox hub and Azurite by connection strings
            wheelhouse.build(out, ["windows"], [], wine.interpreter(), with_sdk=True)
    return bundle


def _config(fleet: Fleet) -> Dict[str, object]:
    storage = fleet.storage
    assert fleet.imds is not None
    return {
        "imds_url": fleet.imds.vm_url(VM), "sink": "eventhub",
        "eventhub_connection_string": processes.eventhubs_connection_string(
            fleet.servers["eventhubs"].port, HUB),
        "queue_connection_string": storage, "authenticate": True,
        "poll_interval": 1, "heartbeat_interval": 2, "approval_fast_interval": 1,
        "approval_visibility_timeout": 60, "hook_timeout": 20,
    }


@pytest.fixture(scope="module")
def windows_vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WindowsVm]:
    timings: Dict[str, float] = {}
    t0 = time.monotonic()
    try:
        wine.ensure_prefix()
    except wine.WineUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    timings["prefix"] = time.monotonic() - t0
    with wine.locked("wine-prefix-use"):  # one install at C:\\Program Files at a time
        t0 = time.monotonic()
        archive = windows_bundle()
        timings["bundle"] = time.monotonic() - t0
        work = tmp_path_factory.mktemp("windows-vm")
        unpacked = work / "bundle"
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(unpacked)  # our own bundle, just built
        # Wine only: `platform` (pip, azure-core's user agent) crashes Wine through _wmi.pyd
        (unpacked / "python" / "_wmi.pyd").rename(work / "_wmi.pyd.wine-crashes")
        wine.start_background()
        agentless = VmSpec(VM, {"os": "windows"}, forwarder=False)  # its forwarder is this suite's
        fleet = Fleet(FleetSettings(work=work / "fleet", vms=(agentless,), policy=POLICY,
                                    central_instances=1, time_scale=5.0))
        fleet.start()
        vm = WindowsVm(fleet=fleet, bundle=unpacked, timings=timings, where=windows_install.layout({}))
        try:
            t0 = time.monotonic()
            plan = vm.installer("plan")  # where this Windows says things go (%ProgramFiles%, %ProgramData%)
            vm.where = windows_install.Layout(**json.loads(plan[plan.index("{"):])["layout"])
            vm.installer("uninstall", "--purge")  # a fresh VM: nothing from an earlier session
            config = work / "config.json"
            config.write_text(json.dumps(_config(fleet)))
            vm.installer("stage", "--bundle", wine.windows_path(unpacked),
                         "--config-file", wine.windows_path(config))
            vm.installer("activate")
            timings["install"] = time.monotonic() - t0
            hook = vm.local(vm.where.hook_dir) / "pre-approve.d" / "10-drain.cmd"
            hook.write_bytes(HOOK.encode())
            yield vm
        finally:
            for daemon in vm.daemons:
                daemon.terminate()
            fleet.stop()
            print(f"\nwindows suite (CPython {embedded_python.VERSION} under Wine) set-up seconds: "
                  + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()), flush=True)
