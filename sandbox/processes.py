"""Start the stand-in servers as child processes on free loopback ports, and stop them by PID.

Tests, the demo and the benchmarks share these so each server is started one way only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"

# Azurite's fixed development account (public, documented by Microsoft; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
# pragma: allowlist nextline secret
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def minimal_env(**extra: str) -> Dict[str, str]:
    """The environment a test gives a child on purpose stripped of everything (so no setting leaks in from
    the test's own): the system PATH, this process's clock, and `extra`. The clock is Debian's faketime's
    variables (LD_PRELOAD, FAKETIME*, and the PYTHONPATH of tools/any_date.py's sleep fix): a child keeps the
    moved calendar its parent runs on (nothing on a normal run)."""
    clock = {k: v for k, v in os.environ.items()
             if "FAKETIME" in os.environ and (k.startswith("FAKETIME") or k in ("LD_PRELOAD", "PYTHONPATH"))}
    return {"PATH": "/usr/bin:/bin", **clock, **extra}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0, proc: Optional[subprocess.Popen] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"process {proc.args!r} exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {LOOPBACK}:{port} after {timeout}s")


@dataclass
class Server:
    """A child process serving on loopback. `stop()` signals its PID (SIGTERM, then SIGKILL)."""

    name: str
    proc: subprocess.Popen
    ports: Dict[str, int]
    log_path: Optional[Path] = None
    extra: Dict[str, str] = field(default_factory=dict)
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL in stop()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return next(iter(self.ports.values()))

    def stop(self, timeout: Optional[float] = None) -> None:
        if self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.grace if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL: a crash, for fault tests."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def start(name: str, argv: Sequence[str], ports: Dict[str, int], log_dir: Optional[Path] = None,
          env: Optional[Dict[str, str]] = None, timeout: float = 30.0) -> Server:
    """Run `argv`, wait until every port in `ports` accepts connections."""
    log_path = None
    out = subprocess.DEVNULL
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        out = open(log_path, "ab")  # handed to the child; closed with it
    child_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(list(argv), cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=child_env)
    server = Server(name=name, proc=proc, ports=dict(ports), log_path=log_path)
    try:
        for port in ports.values():
            wait_for_port(port, timeout=timeout, proc=proc)
    except Exception:
        server.kill()
        raise
    return server


# ---- Azurite --------------------------------------------------------------------------------

def azurite_connection_string(blob: int, queue: int, table: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://{LOOPBACK}:{blob}/{AZURITE_ACCOUNT};"
        f"QueueEndpoint=http://{LOOPBACK}:{queue}/{AZURITE_ACCOUNT};"
        f"TableEndpoint=http://{LOOPBACK}:{table}/{AZURITE_ACCOUNT};"
    )


def start_azurite(log_dir: Optional[Path] = None, location: Optional[Path] = None,
                  ports: Optional[Dict[str, int]] = None,
                  oauth_tls: Optional[Tuple[Path, Path]] = None) -> Server:
    """Azurite from node_modules (npm ci), in memory unless `location` is given. `ports` (blob, queue,
    table; e.g. a stopped Azurite's `.ports`) brings a replacement up where clients already point.
    `oauth_tls` (certificate, key): HTTPS with `--oauth basic`, Azurite's check of Bearer tokens (shape,
    audience, issuer, lifetime; not the signature), which it accepts over HTTPS only."""
    binary = REPO / "node_modules" / ".bin" / "azurite"
    if not binary.exists():
        raise RuntimeError("Azurite is not installed: run `npm ci` (make does it for you)")
    ports = dict(ports) if ports else {"blob": free_port(), "queue": free_port(), "table": free_port()}
    argv: List[str] = [str(binary), "--silent", "--skipApiVersionCheck", "--disableProductStyleUrl",
                       "--blobHost", LOOPBACK, "--queueHost", LOOPBACK, "--tableHost", LOOPBACK,
                       "--blobPort", str(ports["blob"]), "--queuePort", str(ports["queue"]),
                       "--tablePort", str(ports["table"])]
    argv += ["--location", str(location)] if location else ["--inMemoryPersistence"]
    if oauth_tls is not None:
        argv += ["--oauth", "basic", "--cert", str(oauth_tls[0]), "--key", str(oauth_tls[1])]
    server = start("azurite", argv, ports, log_dir=log_dir)
    if location is None:
        # In memory, Azurite waits for idle keep-alive clients (e.g. a checkpoint store's pool) before
        # it exits on SIGTERM; with nothing to flush, a short grace then SIGKILL loses nothing.
        server.grace = 2.0
    server.extra["connection_string"] = azurite_connection_string(
        ports["blob"], ports["queue"], ports["table"])
    return server


# ---- The project's own stand-ins ----------------------------------------------------------------

def start_imds(args: Sequence[str] = (), log_dir: Optional[Path] = None,
               port: Optional[int] = None) -> Server:
    """The IMDS simulator (`python -m sandbox.imds`). Admin API on the same port under /admin."""
    port = port or free_port()
    return start("imds", [sys.executable, "-m", "sandbox.imds", "--port", str(port), *args],
                 {"http": port}, log_dir=log_dir)


PLATFORM_HUB = "scheduled-events-platform"  # the platform feed's own hub (issue 23; infra: <hub>-platform)


def start_eventhubs(hubs: Sequence[str] = ("scheduled-events=4", f"{PLATFORM_HUB}=2"),
                    log_dir: Optional[Path] = None,
                    port: Optional[int] = None, args: Sequence[str] = (), rest: bool = False) -> Server:
    """The Event Hubs AMQP server (`python -m sandbox.eventhubs`). `hubs`: NAME=PARTITIONS. `rest`: also the
    REST send endpoint over HTTP (its port in `.ports["rest"]`)."""
    port = port or free_port()
    argv = [sys.executable, "-m", "sandbox.eventhubs", "--port", str(port)]
    for hub in hubs:
        argv += ["--hub", hub]
    ports = {"amqp": port}
    if rest:
        ports["rest"] = free_port()
        argv += ["--http-port", str(ports["rest"])]
    server = start("eventhubs", [*argv, *args], ports, log_dir=log_dir)
    server.extra["connection_string_template"] = eventhubs_connection_string(port, "{hub}")
    return server


def eventhubs_connection_string(port: int, hub: str) -> str:
    """The official emulator's connection-string form: the same code runs against Microsoft's emulator."""
    return (f"Endpoint=sb://{LOOPBACK}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
            f"SharedAccessKey=SAS_KEY_VALUE;EntityPath={hub};UseDevelopmentEmulator=true")


def central_hub_settings(port: int, hub: str = "scheduled-events") -> Dict[str, str]:
    """The Function app's Event Hubs settings against a local server: one namespace connection without
    EntityPath (an EntityPath would win over every trigger's hub name), the forwarders' hub and the platform
    hub (start the server with both)."""
    namespace = eventhubs_connection_string(port, hub).replace(f"EntityPath={hub};", "")
    return {"EventHubConnection": namespace, "EVENTHUB_NAME": hub, "PLATFORM_EVENTHUB_NAME": PLATFORM_HUB}


def start_webhook_receiver(args: Sequence[str] = (), log_dir: Optional[Path] = None,
                           port: Optional[int] = None) -> Server:
    """The local alert webhook receiver (`python -m sandbox.webhook_receiver`); it prints each alert."""
    port = port or free_port()
    return start("webhook", [sys.executable, "-m", "sandbox.webhook_receiver", "--port", str(port), *args],
                 {"http": port}, log_dir=log_dir)
