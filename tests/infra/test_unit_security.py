"""se-forwarder.service as systemd itself reads it, on this machine (no boot): `systemd-analyze security
--offline=yes` scores it <= 1.0, `systemd-analyze verify` has nothing to say but that the program is not
installed here, no key is one systemd 247 (Debian 11) or 252 (Debian 12) does not know, and the IP allow
list is what the unit's comment says. tests/vm_linux verifies the installed unit inside Debian 11 and 12.

systemd-analyze comes with systemd (Debian: the `systemd` package; .ci/run installs it): without it
these tests fail, they do not skip.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "infra" / "forwarder" / "se-forwarder.service"
MAX_EXPOSURE = 1.0
# Keys that need systemd >= 254; install-forwarder.sh writes them to a drop-in only there.
NEWER_KEYS = ("RestartSteps", "RestartMaxDelaySec")


def _analyze(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze not found: apt-get install -y systemd (see .ci/run)"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)


def _values(key: str) -> List[str]:
    return [line.split("=", 1)[1] for line in UNIT.read_text().splitlines() if line.startswith(f"{key}=")]


def test_exposure_is_at_most_1_0() -> None:
    done = _analyze("security", "--offline=yes", "--no-pager", str(UNIT))
    match = re.search(r"Overall exposure level for se-forwarder\.service: (\d+\.\d)", done.stdout)
    assert match, done.stdout + done.stderr
    print(f"systemd-analyze security --offline=yes: exposure {match.group(1)}")
    assert float(match.group(1)) <= MAX_EXPOSURE, done.stdout
    # the same gate as systemd's own threshold (exposure x 10, rounded up)
    gate = _analyze("security", "--offline=yes", f"--threshold={int(MAX_EXPOSURE * 10)}", str(UNIT))
    assert gate.returncode == 0, gate.stdout + gate.stderr


def test_verify_finds_nothing_but_the_missing_program() -> None:
    done = _analyze("verify", str(UNIT))
    complaints = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    # The program exists only on a VM (and in tests/vm_linux, which verifies the installed unit there).
    allowed = "se-forwarder.service: Command /opt/se-forwarder/venv/bin/se-forwarder is not executable"
    assert all(line.startswith(allowed) for line in complaints), complaints


def test_no_key_older_systemd_does_not_know() -> None:
    for key in NEWER_KEYS:
        assert not _values(key), f"{key} is unknown to systemd < 254; it belongs in the installer's drop-in"
    script = (REPO / "infra" / "forwarder" / "install-forwarder.sh").read_text()
    assert all(f"{key}=" in script for key in NEWER_KEYS) and "-ge 254" in script


def test_ip_allow_list_is_unicast_loopback_and_imds_only() -> None:
    assert _values("IPAddressDeny") == ["any"]
    entries = [e for value in _values("IPAddressAllow") for e in value.split()]
    assert "localhost" in entries and "169.254.169.254" in entries
    nets = [ipaddress.ip_network(e) for e in entries if e != "localhost"]
    v4 = list(ipaddress.collapse_addresses(n for n in nets if n.version == 4))
    expected: List[ipaddress.IPv4Network] = []
    for net in ipaddress.ip_network("0.0.0.0/0").address_exclude(ipaddress.ip_network("224.0.0.0/3")):
        link_local = ipaddress.ip_network("169.254.0.0/16")
        expected += list(net.address_exclude(link_local)) if net.overlaps(link_local) else [net]
    expected.append(ipaddress.ip_network("169.254.169.254/32"))
    assert v4 == list(ipaddress.collapse_addresses(expected))
    v6 = {str(n) for n in nets if n.version == 6}
    assert v6 == {"2000::/3", "fc00::/7"}  # global unicast and unique-local (private endpoints)
