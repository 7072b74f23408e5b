"""Run inside a container unit by tests/vm_linux/test_ip_allow_list.py (the container's python3, no
project code): prints JSON {"udp": {address: "sent" | errno name}, "imds": status or error, "bpf": errno
name of a bpf(BPF_PROG_LOAD) call with no program}.

A UDP datagram that systemd's IP firewall drops fails at once with EPERM (its egress program runs in the
send), whatever the network behind it does; one that passes is "sent". The bpf() call tells whether this
process may load BPF programs at all (EPERM: a seccomp filter refuses it; EFAULT/EINVAL: it may).
"""

import ctypes
import errno
import json
import platform
import socket
import sys
import urllib.request

BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
BPF_PROG_LOAD = 5


def udp(address: str) -> str:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(b"probe", (address, 9))
            return "sent"
        except OSError as exc:
            return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def imds(url: str) -> object:
    request = urllib.request.Request(url, headers={"Metadata": "true"})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def bpf() -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(BPF_SYSCALL[platform.machine()], BPF_PROG_LOAD, None, 0) == 0:
        return "0"
    return errno.errorcode.get(ctypes.get_errno(), "?")


if __name__ == "__main__":
    print(json.dumps({"udp": {a: udp(a) for a in sys.argv[2:]}, "imds": imds(sys.argv[1]), "bpf": bpf()}))
