"""Debian root file systems for the systemd tests, built once per machine and kept.

`debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,python3,python3-venv SUITE` from the
mirror apt already uses (/etc/apt/sources.list*), into /var/cache/se-forwarder-tests/rootfs-SUITE
(~70 s and ~290 MB each). A file lock keeps two pytest-xdist workers from building the same one; a build
goes to rootfs-SUITE.build and is renamed when complete, so a half-built root is never used.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator, List, Tuple

CACHE = Path(os.environ.get("SE_VM_TEST_CACHE", "/var/cache/se-forwarder-tests"))
PACKAGES = "systemd,systemd-sysv,dbus,python3,python3-venv"
BUILD_TIMEOUT = 900
NEEDS = ("systemd-nspawn", "debootstrap", "nsenter", "systemd-analyze")


class CannotRun(RuntimeError):
    """What this machine lacks to run the tests (a test FAILS with it: these tests never skip)."""


def require_tools() -> None:
    missing = [tool for tool in NEEDS if shutil.which(tool) is None]
    if missing:
        raise CannotRun(f"missing {', '.join(missing)}: apt-get install -y systemd-container debootstrap "
                        "(.ci/run does)")
    if os.geteuid() != 0:
        raise CannotRun("systemd-nspawn and debootstrap need root")


def _source_entries() -> Iterator[Tuple[str, str]]:
    """(uri, suites) of every apt source on this machine, one-line and deb822 formats."""
    files: List[Path] = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file() or not path.name.endswith((".list", ".sources")):
            continue
        text = path.read_text(errors="replace")
        if path.name.endswith(".list"):
            for line in text.splitlines():
                match = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if match:
                    yield match.group(1), match.group(2)
        else:
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, flags=re.M))
                if "deb" in fields.get("Types", "").split():
                    for uri in fields.get("URIs", "").split():
                        yield uri, fields.get("Suites", "")


def apt_mirror() -> str:
    """The Debian archive apt uses here (not the security one): debootstrap must use it too (no other
    host is reachable). SE_VM_TEST_MIRROR overrides."""
    if os.environ.get("SE_VM_TEST_MIRROR"):
        return os.environ["SE_VM_TEST_MIRROR"]
    for uri, suites in _source_entries():
        if "security" not in uri and "security" not in suites and "/debian" in uri:
            return uri
    raise CannotRun("no Debian archive in /etc/apt/sources.list*: set SE_VM_TEST_MIRROR")


def rootfs(suite: str) -> Path:
    """The cached root of `suite` (bookworm, bullseye), built on first use. Returns its path."""
    require_tools()
    CACHE.mkdir(parents=True, exist_ok=True)
    final = CACHE / f"rootfs-{suite}"
    with open(CACHE / f"rootfs-{suite}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker builds; this one waits for it
        if (final / "usr/lib/systemd/systemd").exists() or (final / "lib/systemd/systemd").exists():
            return final
        building = CACHE / f"rootfs-{suite}.build"
        shutil.rmtree(building, ignore_errors=True)
        t0 = time.monotonic()
        done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={PACKAGES}", suite,
                               str(building), apt_mirror()], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT)
        if done.returncode != 0:
            raise CannotRun(f"debootstrap {suite} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                            f"{done.stderr[-2000:]}")
        building.rename(final)
        print(f"rootfs {suite}: built in {time.monotonic() - t0:.0f} s", flush=True)
        return final
