"""Upgrade, reboot and uninstall of the forwarder under a real systemd (Debian 12), on a root that keeps
its state (a copy of the cached root, booted without an overlay, so a poweroff and a second boot see the
same disk). Each test installs first if a test before left nothing installed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest

from sandbox.demo.fleet import Fleet

from .bundle import broken_bundle, newer_bundle
from .conftest import Boot
from .container import Container
from .vm import (
    UNIT,
    VM,
    add_event,
    install,
    journal_json,
    main_pid,
    posts,
    wait_approved,
    wait_for,
    wait_running,
)

CUSTOM_HOOK = "/etc/se-forwarder/hooks/post-event.d/20-mine"


@pytest.fixture(scope="module")
def newer(bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    dest = tmp_path_factory.mktemp("newer")
    version = newer_bundle(bundle_dir, dest)
    yield dest, version


@pytest.fixture(scope="module")
def broken(bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("broken")
    broken_bundle(bundle_dir, dest)
    return dest


@pytest.fixture(scope="module")
def vm(boot: Boot, bundle_dir: Path, newer: tuple, broken: Path) -> Container:
    return boot("bookworm", persistent=True,
                binds={bundle_dir: "/mnt/artifacts", newer[0]: "/mnt/newer", broken: "/mnt/broken"})


def _installed(vm: Container, fleet: Fleet) -> int:
    if vm.run("test", "-e", "/opt/se-forwarder/venv", check=False).returncode != 0:
        install(vm, fleet)
    return wait_running(vm)


def _version(vm: Container) -> str:
    return vm.run("/opt/se-forwarder/venv/bin/se-forwarder", "--version").stdout.split()[-1]


def _state(vm: Container) -> Tuple[str, int, str]:
    """(the outbox database's inode, its last sequence number, the approvals ledger's text)."""
    inode = vm.run("stat", "-c", "%i", "/var/lib/se-forwarder/outbox.sqlite3").stdout.strip()
    seq = vm.run("python3", "-c", "import sqlite3; print(sqlite3.connect("
                 "'file:/var/lib/se-forwarder/outbox.sqlite3?mode=ro', uri=True).execute("
                 "\"select seq from sqlite_sequence where name = 'outbox'\").fetchone()[0])").stdout
    return inode, int(seq), vm.run("cat", "/var/lib/se-forwarder/approvals-ledger.json").stdout


def test_an_upgrade_keeps_the_outbox_and_approves_nothing_twice(vm: Container, fleet: Fleet,
                                                               newer: tuple) -> None:
    _installed(vm, fleet)
    before_version = _version(vm)
    event_id = add_event(fleet, eventType="Reboot", eventSource="User", startedSeconds=120)
    wait_approved(fleet, event_id)
    inode, seq, ledger = _state(vm)
    assert event_id in ledger  # the approval is in the VM's ledger
    t0 = time.monotonic()
    done = install(vm, fleet, artifacts="/mnt/newer")
    print(f"upgrade: {time.monotonic() - t0:.1f} s")
    assert "done: se-forwarder.service is running" in done.stdout, done.stdout + done.stderr
    new_pid = wait_running(vm)
    assert (before_version, _version(vm)) == (before_version, newer[1]) and before_version != newer[1]
    assert [e for e in journal_json(vm, "configuration", pid=new_pid)], "the new process did not start"
    releases = vm.run("sh", "-c", "ls -d /opt/se-forwarder/venv-*").stdout.split()
    assert len(releases) == 1, releases  # the old release is gone once the new one stays up
    inode_after, seq_after, ledger_after = _state(vm)
    # the same outbox database, its numbering going on (not a new one), the ledger still holding the approval
    assert inode_after == inode and seq_after > seq and event_id in ledger_after
    # the new process sees the approved event (Started) in IMDS and does not approve it again
    wait_for("three heartbeats of the new process",
             lambda: len(journal_json(vm, "heartbeat", pid=new_pid)) >= 3, timeout=30)
    assert fleet.imds is not None and fleet.imds.event(event_id)["approvedBy"] == [VM]
    assert [p["status"] for p in posts(fleet, event_id)] == [200]


def test_a_failed_upgrade_leaves_the_running_release(vm: Container, fleet: Fleet) -> None:
    pid = _installed(vm, fleet)
    release = vm.run("readlink", "/opt/se-forwarder/venv").stdout.strip()
    done = install(vm, fleet, artifacts="/mnt/broken", check=False)  # a wheel is missing: pip fails
    assert done.returncode == 1 and "the installed one (if any) is unchanged" in done.stderr, done.stderr
    assert vm.run("readlink", "/opt/se-forwarder/venv").stdout.strip() == release
    releases = vm.run("sh", "-c", "ls -d /opt/se-forwarder/venv-*").stdout.split()
    assert releases == [f"/opt/se-forwarder/{release}"]  # the half-built one is removed
    assert main_pid(vm) == pid and vm.show(UNIT, "NRestarts")["NRestarts"] == "0"  # never stopped


def test_a_reboot_with_an_event_open_resumes_without_a_second_approval(vm: Container, fleet: Fleet) -> None:
    _installed(vm, fleet)
    # approved and Started for 10 simulated minutes (2 real at the fleet's time scale): open across the boot
    event_id = add_event(fleet, eventType="Reboot", eventSource="User", startedSeconds=600)
    wait_approved(fleet, event_id)
    t0 = time.monotonic()
    vm.poweroff()
    vm.boot()
    print(f"poweroff and boot: {time.monotonic() - t0:.1f} s")
    pid = wait_running(vm)  # enabled: started by the boot
    assert vm.show(UNIT, "NRestarts")["NRestarts"] == "0"
    wait_for("three heartbeats after the boot", lambda: len(journal_json(vm, "heartbeat", pid=pid)) >= 3,
             timeout=40)
    assert fleet.imds is not None and fleet.imds.event(event_id)["state"] == "Started"  # still open
    assert [p["status"] for p in posts(fleet, event_id)] == [200]
    assert main_pid(vm) == pid


def test_an_install_over_a_plain_venv_directory_repairs_it(vm: Container, fleet: Fleet) -> None:
    """What the installer before releases left: /opt/se-forwarder/venv a directory whose console scripts
    name a path that is gone (it built venv.new and renamed it). systemd cannot start that (203/EXEC);
    the next install replaces it with a release and the service runs."""
    _installed(vm, fleet)
    release = vm.run("readlink", "/opt/se-forwarder/venv").stdout.strip()
    vm.sh(f"systemctl stop {UNIT} && rm /opt/se-forwarder/venv && "
          f"mv /opt/se-forwarder/{release} /opt/se-forwarder/venv")
    vm.run("systemctl", "start", UNIT, check=False)
    wait_for("the old layout failing to start (203/EXEC)",
             lambda: vm.show(UNIT, "ExecMainStatus")["ExecMainStatus"] == "203", timeout=30)
    done = install(vm, fleet)
    assert "done: se-forwarder.service is running" in done.stdout, done.stdout + done.stderr
    assert vm.run("test", "-L", "/opt/se-forwarder/venv", check=False).returncode == 0
    left = vm.run("sh", "-c", "ls -d /opt/se-forwarder/venv*").stdout.split()
    current = vm.run("readlink", "-f", "/opt/se-forwarder/venv").stdout.strip()
    assert left == ["/opt/se-forwarder/venv", current]  # the old directory is gone
    wait_running(vm)


def test_uninstall_keeps_the_outbox_user_and_own_hooks_and_purge_removes_them(vm: Container,
                                                                               fleet: Fleet) -> None:
    _installed(vm, fleet)
    vm.run("install", "-m", "0755", "/dev/stdin", CUSTOM_HOOK, input="#!/bin/sh\nexit 0\n")
    done = vm.run("bash", "/mnt/artifacts/install-forwarder.sh", "--uninstall")
    assert "kept /var/lib/se-forwarder" in done.stdout, done.stdout
    assert vm.show(UNIT, "LoadState")["LoadState"] == "not-found"
    gone = ["/opt/se-forwarder", "/etc/systemd/system/se-forwarder.service", "/etc/se-forwarder/config.json",
            "/etc/se-forwarder/hooks/pre-approve.d"]
    for path in gone:
        assert vm.run("test", "-e", path, check=False).returncode != 0, path
    assert vm.run("sh", "-c", "find /etc/se-forwarder -name '*.example'").stdout == ""
    for path in (CUSTOM_HOOK, "/var/lib/se-forwarder/outbox.sqlite3"):
        assert vm.run("test", "-e", path, check=False).returncode == 0, path
    assert vm.run("id", "se-forwarder", check=False).returncode == 0
    owners = vm.sh("for p in /proc/[0-9]*; do stat -c %U $p 2>/dev/null; done").stdout.split()
    assert "se-forwarder" not in owners  # stopped
    done = vm.run("bash", "/mnt/artifacts/install-forwarder.sh", "--uninstall", "--purge")
    for path in ("/etc/se-forwarder", "/var/lib/se-forwarder", "/opt/se-forwarder"):
        assert vm.run("test", "-e", path, check=False).returncode != 0, path
    assert vm.run("id", "se-forwarder", check=False).returncode != 0
