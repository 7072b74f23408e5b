"""The unit's IP allow list (IPAddressDeny=any + IPAddressAllow=...), enforced by a real systemd 252.

systemd filters with BPF programs on the unit's cgroup (cgroup v2). This kernel has them
(CONFIG_CGROUP_BPF=y, cgroup2 in /proc/filesystems); what stops them in the other suites' containers is
systemd-nspawn: its default seccomp filter refuses bpf() (EPERM), so the container's systemd logs, at
debug level while booting, "bpf-firewall: Can't load kernel CGROUP SKB BPF program, BPF firewalling is
not supported: Operation not permitted" and runs every unit unfiltered. Booted with the unified
hierarchy (SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1) and `--system-call-filter=bpf`, it finds "Controller
'bpf-firewall' supported: yes" and enforces the list: that container is the one used here.

The probe runs in a service carrying the shipped unit's IPAddress lines verbatim: a datagram to a
denied address fails with EPERM at once, an allowed one is sent, and IMDS (the simulator) on loopback
answers. The installed forwarder itself runs under the list in test_service.py (same container flags).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from sandbox import processes
from sandbox.imds.client import ImdsSimulator

from . import rootfs
from .container import Container

UNIT_FILE = processes.REPO / "infra" / "forwarder" / "se-forwarder.service"
HERE = Path(__file__).resolve().parent
VM = "vm-ip"
# What a forwarder on Azure reaches (docs/forwarder.md): loopback, IMDS, the wire server / Azure DNS,
# Event Hubs and Storage at public addresses or private endpoints in the VNet (any private range),
# and IPv6 global or unique-local addresses.
ALLOWED = ["127.0.0.1", "169.254.169.254", "168.63.129.16", "20.60.0.1", "40.112.0.1", "10.0.0.4",
           "172.16.0.4", "192.168.0.4", "100.64.0.4", "::1", "2001:db8::1", "fd00::4"]
# The rest of link-local (169.254/16 but IMDS, fe80::/10), multicast and reserved ranges.
DENIED = ["169.254.1.1", "169.254.169.253", "224.0.0.251", "239.255.255.250", "240.0.0.1", "fe80::1",
          "ff02::1"]


def _ip_lines() -> List[str]:
    return [line for line in UNIT_FILE.read_text().splitlines()
            if line.startswith(("IPAddressDeny=", "IPAddressAllow="))]


@pytest.fixture(scope="module")
def imds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = processes.start_imds(["--vm", json.dumps({"name": VM}), "--rate-limit", "0"],
                                  log_dir=tmp_path_factory.mktemp("imds"))
    try:
        yield ImdsSimulator(f"http://127.0.0.1:{server.port}").vm_url(VM)
    finally:
        server.stop()


def _probe(tmp: Path, imds_url: str, bpf_firewall: bool, ip_lines: List[str]) -> Dict[str, object]:
    rootfs.require_tools()
    name = f"se-ip-{os.getpid()}-{int(bpf_firewall)}"
    vm = Container(rootfs.rootfs("bookworm"), name, tmp / f"{name}.log", binds={HERE: "/probe"},
                   bpf_firewall=bpf_firewall)
    try:
        vm.boot()
        unit = "\n".join(["[Service]", "Type=oneshot", "StandardOutput=file:/run/ip-probe.json", *ip_lines,
                          f"ExecStart=/usr/bin/python3 /probe/ip_probe.py {imds_url}/metadata/"
                          f"scheduledevents?api-version=2020-07-01 {' '.join(ALLOWED + DENIED)}", ""])
        vm.run("sh", "-c", "cat > /run/systemd/system/ip-probe.service && systemctl daemon-reload",
               input=unit)
        vm.run("systemctl", "start", "ip-probe.service", timeout=120)
        shown = vm.run("systemctl", "show", "ip-probe.service", "-p", "IPAddressDeny").stdout.strip()
        assert ("0.0.0.0/0" in shown) == bool(ip_lines), shown  # the lines were read as written
        return json.loads(vm.run("cat", "/run/ip-probe.json").stdout)
    finally:
        vm.stop()


def test_the_units_allow_list_is_enforced_where_systemd_has_its_bpf_firewall(imds: str,
                                                                            tmp_path: Path) -> None:
    t0 = time.monotonic()
    seen = _probe(tmp_path, imds, bpf_firewall=True, ip_lines=_ip_lines())
    print(f"\nIP allow list, systemd 252 with its BPF firewall ({time.monotonic() - t0:.1f} s): {seen}")
    assert seen["bpf"] != "EPERM", seen  # the service may load BPF programs: systemd could too
    assert {a: seen["udp"][a] for a in ALLOWED} == {a: "sent" for a in ALLOWED}
    assert {a: seen["udp"][a] for a in DENIED} == {a: "EPERM" for a in DENIED}
    assert seen["imds"] == 200  # IMDS (here the simulator on loopback) still answers


def test_without_the_list_the_same_container_sends_everywhere(imds: str, tmp_path: Path) -> None:
    """The control: the same probe, no IPAddress lines: the denied addresses are sent, so the EPERMs
    above are the firewall's, not the network's."""
    seen = _probe(tmp_path, imds, bpf_firewall=True, ip_lines=[])
    assert set(seen["udp"].values()) == {"sent"}, seen
    assert seen["imds"] == 200


def test_the_other_suites_containers_run_the_list_unenforced_and_why(imds: str, tmp_path: Path) -> None:
    """nspawn's default seccomp filter refuses bpf(): systemd there cannot load the firewall, and the
    unit's denied addresses go out. Said loudly: test_lifecycle.py's and test_bullseye.py's containers
    do not enforce the list; this module's and test_service.py's do."""
    seen = _probe(tmp_path, imds, bpf_firewall=False, ip_lines=_ip_lines())
    print("\nNOT ENFORCED in the default nspawn container (test_lifecycle.py, test_bullseye.py): bpf() -> "
          f"{seen['bpf']} (nspawn's seccomp filter); denied addresses: "
          f"{ {a: seen['udp'][a] for a in DENIED} }")
    assert seen["bpf"] == "EPERM", seen
    assert {a: seen["udp"][a] for a in DENIED} == {a: "sent" for a in DENIED}
