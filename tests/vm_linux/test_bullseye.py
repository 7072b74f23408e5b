"""The oldest Linux the docs name: Debian 11 (systemd 247, Python 3.9). The real install from the real
bundle, as the CustomScript extension runs it; the service starts, stays up as its own user, and one
event goes to central and its approval comes back through the queue to an IMDS POST.
"""

from __future__ import annotations

import time
from pathlib import Path

from sandbox.demo.fleet import Fleet

from .conftest import Boot
from .vm import UNIT, VM, add_event, install, posts, wait_approved, wait_running


def test_debian_11_installs_runs_and_is_approved(boot: Boot, bundle_dir: Path, fleet: Fleet) -> None:
    vm = boot("bullseye", binds={bundle_dir: "/mnt/artifacts"})
    assert vm.run("python3", "-c", "import sys; print(sys.version_info[:2])").stdout.strip() == "(3, 9)"
    assert vm.run("systemctl", "--version").stdout.split()[1] == "247"
    t0 = time.monotonic()
    done = install(vm, fleet)
    print(f"install-forwarder.sh on Debian 11: {time.monotonic() - t0:.1f} s")
    assert "done: se-forwarder.service is running" in done.stdout, done.stdout + done.stderr
    pid = wait_running(vm)
    assert vm.run("stat", "-c", "%U", f"/proc/{pid}").stdout.strip() == "se-forwarder"
    assert vm.show(UNIT, "NRestarts")["NRestarts"] == "0"
    verify = vm.run("systemd-analyze", "verify", UNIT, check=False)
    said = (verify.stdout + verify.stderr).strip()
    assert verify.returncode == 0 and not said, said
    print("live exposure in Debian 11:", vm.run("systemd-analyze", "security", "--no-pager", UNIT
                                                ).stdout.splitlines()[-1])
    event_id = add_event(fleet, eventType="Reboot", eventSource="User", startedSeconds=15)
    assert wait_approved(fleet, event_id)["approvedBy"] == [VM]
    assert [p["status"] for p in posts(fleet, event_id)] == [200]
