"""A Debian root booted with systemd as PID 1 (systemd-nspawn), reached with nsenter.

The host has no systemd or D-Bus of its own, hence `--register=no --keep-unit`; machinectl cannot reach
the container, `nsenter -t <its PID 1> -a` can (PID 1: the child of systemd-nspawn whose comm is
`systemd`; nspawn forks a short-lived helper first). The container shares the host's network, so the
sandbox servers on 127.0.0.1 are reachable from inside. `volatile=True` boots an overlay that vanishes
with the container; False writes to the root itself (a copy, for a reboot that keeps state).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

from .rootfs import CannotRun

ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
       "HOME": "/root", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}


def _children(pid: int) -> List[int]:
    found: List[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Container:
    def __init__(self, root: Path, name: str, log: Path, volatile: bool = True,
                 binds: Optional[Dict[Path, str]] = None, bpf_firewall: bool = False) -> None:
        self.root, self.name, self.log, self.volatile = root, name, log, volatile
        self.binds = binds or {}
        # systemd's IP firewall (IPAddressDeny=/Allow=) needs cgroup v2 and the bpf() call, which
        # nspawn's default seccomp filter refuses (EPERM: "Can't load kernel CGROUP SKB BPF program");
        # off by default, as the other suites' containers were measured without it
        self.bpf_firewall = bpf_firewall
        self.proc: Optional[subprocess.Popen] = None
        self.pid1 = 0

    def boot(self, timeout: float = 60.0) -> float:
        """Start it and wait until systemd says running (or degraded). Returns the seconds it took."""
        argv = ["systemd-nspawn", "-D", str(self.root), "--boot", "--register=no", "--keep-unit",
                "--console=pipe", "-M", self.name]
        if self.volatile:
            argv.append("--volatile=overlay")
        argv += [f"--bind-ro={host}:{inside}" for host, inside in self.binds.items()]
        env = dict(os.environ)
        if self.bpf_firewall:
            argv.append("--system-call-filter=bpf")
            env["SYSTEMD_NSPAWN_UNIFIED_HIERARCHY"] = "1"
        t0 = time.monotonic()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                         start_new_session=True, env=env)
        deadline = t0 + timeout
        while time.monotonic() < deadline and not self.pid1:
            if self.proc.poll() is not None:
                raise CannotRun(f"systemd-nspawn exited {self.proc.returncode}: {self.log_tail()}")
            self.pid1 = next((p for p in _children(self.proc.pid) if _comm(p) == "systemd"), 0)
            time.sleep(0.05)
        state = ""
        while time.monotonic() < deadline:
            state = self.run("systemctl", "is-system-running", check=False, timeout=10).stdout.strip()
            if state in ("running", "degraded"):
                return time.monotonic() - t0
            time.sleep(0.2)
        raise CannotRun(f"{self.name} did not boot in {timeout:g} s (state {state!r}): {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def run(self, *argv: str, check: bool = True, timeout: float = 120.0,
            input: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run argv inside the container (all its namespaces, as its root), with a clean environment."""
        assert self.pid1, "not booted"
        command = ["nsenter", "-t", str(self.pid1), "-a", "--", "env", "-i",
                   *[f"{k}={v}" for k, v in {**ENV, **(env or {})}.items()], *argv]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {done.returncode}\n{done.stdout[-4000:]}\n"
                                 f"{done.stderr[-4000:]}")
        return done

    def sh(self, script: str, **kwargs: object) -> subprocess.CompletedProcess:
        return self.run("sh", "-c", script, **kwargs)  # type: ignore[arg-type]

    def show(self, unit: str, *props: str) -> Dict[str, str]:
        out = self.run("systemctl", "show", unit, *[f"-p{p}" for p in props]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def poweroff(self, timeout: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.run("systemctl", "poweroff", "--no-block", check=False, timeout=20)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
        self.pid1 = 0

    def stop(self) -> None:
        """Power off by signal (nspawn turns SIGTERM into a shutdown), then SIGKILL its group."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.pid1 = 0
