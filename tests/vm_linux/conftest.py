"""Fixtures of the systemd tests: the cached Debian roots and bundle, central with its stand-ins on the
host's loopback (sandbox.demo.fleet.Fleet with one agentless VM: its forwarder is the one installed in
the container), and booted containers, powered off by the fixture that booted them.

These tests need root, systemd-container and debootstrap (.ci/run installs them). Without them they FAIL
with what is missing: a machine that cannot run them must not pass them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

from sandbox.demo.fleet import Fleet, FleetSettings, VmSpec

from . import bundle, rootfs
from .container import Container
from .vm import VM

_names = itertools.count()
Boot = Callable[..., Container]


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    # The first test of a fresh machine builds a root (debootstrap, up to 900 s) and the bundle (up to
    # 1200 s) in its setup, each bounded by its own timeout; the project's 300 s would cut that short.
    for item in items:
        if "vm_linux" in str(item.fspath):
            item.add_marker(pytest.mark.timeout(1800))


@pytest.fixture(scope="session")
def bundle_dir() -> Path:
    rootfs.require_tools()
    t0 = time.monotonic()
    path = bundle.linux_bundle()
    print(f"bundle ready in {time.monotonic() - t0:.1f} s: {path}")
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Central (one Functions runner instance), the hub, Azurite and the IMDS simulator serving VM."""
    settings = FleetSettings(work=tmp_path_factory.mktemp("fleet"),
                             vms=(VmSpec(VM, {"role": "web"}, forwarder=False),), central_instances=1)
    with Fleet(settings) as running:
        yield running


@pytest.fixture(scope="module")
def boot(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boot]:
    """boot(suite, persistent=False, binds={host: inside}) -> a running Container. A persistent one
    boots a copy of the cached root (kept across a poweroff, removed at the end of the module). The VMs
    power off before central and its stand-ins stop (`fleet` is set up first, so torn down last)."""
    started: List[Container] = []
    copies: List[Path] = []

    def _boot(suite: str, persistent: bool = False, binds: Optional[Dict[Path, str]] = None,
              root: Optional[Path] = None, bpf_firewall: bool = False) -> Container:
        base = rootfs.rootfs(suite)
        if root is None and persistent:
            root = rootfs.CACHE / f"run-{suite}-{os.getpid()}-{next(_names)}"
            shutil.rmtree(root, ignore_errors=True)
            subprocess.run(["cp", "-a", "--reflink=auto", str(base), str(root)], check=True, timeout=300)
            copies.append(root)
        name = f"se-{suite}-{os.getpid()}-{next(_names)}"
        vm = Container(root or base, name, tmp_path_factory.mktemp("nspawn") / f"{name}.log",
                       volatile=root is None, binds=binds, bpf_firewall=bpf_firewall)
        started.append(vm)
        seconds = vm.boot()
        print(f"{name}: booted in {seconds:.1f} s")
        return vm

    yield _boot
    for vm in started:
        try:
            vm.poweroff(timeout=30)
        finally:
            vm.stop()
    for copy in copies:
        shutil.rmtree(copy, ignore_errors=True)
