"""The demo's fleet: every process of the pipeline, started on loopback and stopped by PID.

Azurite, the sandbox Event Hubs server, one IMDS simulator serving the VMs, the webhook receiver,
the Functions runner running the real function_app.py, and one forwarder process per VM (Event Hubs
sink, approval queue in Azurite, a drain hook). Used by `python -m sandbox.demo`, the end-to-end test
and `bench.approval_loop`, so the wiring exists once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import requests

from sandbox import processes
from sandbox.functions.issuer import TENANT, LocalIssuer
from sandbox.functions.signin import PEOPLE
from sandbox.imds.client import ImdsSimulator

from .vm_agents import start_forwarder

HUB = "scheduled-events"
CAPTURE_CONTAINER = "eventhub-capture"
CAPTURE_INTERVAL = 10  # seconds per Capture window (Azure: 60..900); the open one is written at stop
CONSUMER_GROUP = "central"
TABLE_PREFIX = "demo"
FUNCTION_KEY = "demo-local-function-key"  # the local runner's key (not a secret: loopback only)
# The demo's signed-in people: app role -> (sign-in name, object id) in the local test issuer's tokens.
OPERATORS = PEOPLE  # the same people the sign-in page offers (sandbox/functions/signin.py)
HOOK_SECONDS = 1.0  # what the drain hook "takes"


@dataclass(frozen=True)
class VmSpec:
    name: str
    tags: Dict[str, str] = field(default_factory=dict)
    forwarder: bool = True  # False: an agentless VM (Azure's side only: the platform feed and ARM)

    def simulator_arg(self) -> str:
        return json.dumps({"name": self.name, "tags": self.tags})


# Two VMs share an availability set (IMDS does not name it, so a tag does; docs/central.md).
FLEET = (
    VmSpec("vm-a", {"role": "web"}),
    VmSpec("vm-b", {"role": "db", "avset": "avset-db"}),
    VmSpec("vm-c", {"role": "db", "avset": "avset-db", "priority": "spot"}),
)

# The scenario's central policy (POLICY_JSON). The built-in defaults follow these rules: User -> approve,
# a short Freeze -> approve, anything else -> approve-after-hook.
POLICY: Dict[str, Any] = {
    "version": 1,
    "description": "make demo: drain before a Redeploy; short-notice events are the VM's own (fast path)",
    "rules": [
        {"name": "short-notice-on-vm", "match": {"eventTypes": ["Preempt", "Terminate"]},
         "action": "hold", "severity": "warning"},
        {"name": "drain-before-redeploy", "match": {"eventTypes": ["Redeploy"]},
         "action": "approve-after-hook", "severity": "warning"},
        # a long Freeze waits for a signed-in operator (sandbox/demo/operators.py)
        {"name": "long-freeze-needs-an-operator",
         "match": {"eventTypes": ["Freeze"], "durationInSeconds": {"min": 60}},
         "action": "hold", "severity": "warning"},
    ],
}


@dataclass
class FleetSettings:
    work: Path                                  # logs, state, hooks, settings (wiped at start)
    vms: Sequence[VmSpec] = FLEET
    time_scale: float = 5.0                     # simulated seconds per real second
    poll_interval: float = 1.0                  # forwarder IMDS polls (IMDS recommends 1 s)
    heartbeat_interval: float = 5.0
    approval_fast_interval: float = 2.0         # the forwarder's defaults
    approval_slow_interval: float = 60.0
    reevaluate_schedule: str = "*/2 * * * * *"  # central's timer (NCRONTAB, seconds first)
    policy: Optional[Dict[str, Any]] = field(default_factory=lambda: dict(POLICY))  # None: built-in defaults
    local_approve: bool = True                  # the fast path approves Preempt/Terminate itself
    drain_hook: bool = True                     # False: only the install's *.example hooks (a fresh install)
    hook_seconds: float = HOOK_SECONDS
    queue_port: Optional[int] = None            # forwarders reach the queue service here (bench proxy)
    eventhubs_port: Optional[int] = None        # forwarders reach Event Hubs here (a fault test's gate)
    capture: bool = False                       # Event Hubs Capture to Azurite, saved to <work>/capture
    central_instances: int = 2                  # Functions runner processes sharing the hub and the store
    authenticate: bool = True                   # forwarders sign envelopes; central verifies them
    platform_feed: bool = False                 # the simulator publishes Azure's own feed to the platform hub
    arm: bool = False                           # central's ARM_ENDPOINT is the simulator's stand-in
    central_extra: Dict[str, str] = field(default_factory=dict)  # more app settings for central
    runner_env: Dict[str, Dict[str, str]] = field(default_factory=dict)  # instance name -> more environment
    sign_in: bool = False                       # the issuer's sign-in endpoints, for the console (HTTPS)
    token_lifetime: int = 3600                  # seconds a console sign-in's access token lasts
    platform_auth: bool = True                  # the runner emulates App Service authentication (off: Flex)


class Fleet:
    """Start with `start()` (or `with Fleet(...)`), stop with `stop()`: every child by its PID."""

    def __init__(self, settings: FleetSettings) -> None:
        self.settings = settings
        # `make sandbox` and `make demo` pass relative folders: every path the fleet writes into settings
        # files and argv is absolute from here
        self.work = settings.work.resolve()
        self.servers: Dict[str, processes.Server] = {}
        self.forwarders: Dict[str, processes.Server] = {}
        self.imds: Optional[ImdsSimulator] = None
        # Operators sign in: the runner emulates App Service authentication and trusts this test issuer.
        self.issuer = LocalIssuer(self.work / "central" / "issuer")
        self.tokens: Dict[str, str] = {}

    # ---- paths ---------------------------------------------------------------------------------
    @property
    def hook_record(self) -> Path:
        return self.work / "hooks.jsonl"

    @property
    def settings_file(self) -> Path:
        return self.work / "central" / "local.settings.json"

    def vm_dir(self, name: str) -> Path:
        return self.work / name

    @property
    def storage(self) -> str:
        return self.servers["azurite"].extra["connection_string"]

    @property
    def runner_url(self) -> str:
        return f"http://{processes.LOOPBACK}:{self.servers['functions'].port}"

    @property
    def runner_names(self) -> List[str]:
        """"functions" (the first central instance), then "functions-2", ..."""
        return [n for n in self.servers if n == "functions" or n.startswith("functions-")]

    @property
    def agents(self) -> List[VmSpec]:
        """The VMs with a forwarder."""
        return [vm for vm in self.settings.vms if vm.forwarder]

    @property
    def sign_in_authority(self) -> str:
        return f"https://{processes.LOOPBACK}:{self.servers['signin'].port}/{TENANT}"

    @property
    def console_url(self) -> str:
        return f"{self.runner_url}/api/console/"

    @property
    def webhook_url(self) -> str:
        return f"http://{processes.LOOPBACK}:{self.servers['webhook'].port}"

    # ---- start / stop --------------------------------------------------------------------------
    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self, azurite: Optional[processes.Server] = None,
              eventhubs: Optional[processes.Server] = None) -> None:
        """`azurite`, `eventhubs`: ones already running (the fleet then owns them and stops them)."""
        _fresh_work_dir(self.work)
        if azurite is not None:
            self.servers["azurite"] = azurite
        if eventhubs is not None:
            self.servers["eventhubs"] = eventhubs
        try:
            self._start_all()
        except BaseException:
            self.stop()
            raise

    def _start_all(self) -> None:
        s = self.settings
        if "azurite" not in self.servers:
            self.servers["azurite"] = processes.start_azurite(log_dir=self.work)
        capture = ["--capture-connection-string", self.storage, "--capture-container", CAPTURE_CONTAINER,
                   "--capture-namespace", "sandbox", "--capture-interval", str(CAPTURE_INTERVAL),
                   "--capture-hub", HUB]
        if "eventhubs" not in self.servers:
            self.servers["eventhubs"] = processes.start_eventhubs(
                (f"{HUB}=4", f"{processes.PLATFORM_HUB}=2"), log_dir=self.work,
                args=capture if s.capture else ())
        imds_args = ["--time-scale", f"{s.time_scale:g}"]
        if s.authenticate:  # the simulator's own test PKI signs attested documents; central trusts its root
            imds_args += ["--attestation-dir", str(self.work / "attestation")]
        for vm in s.vms:
            imds_args += ["--vm", vm.simulator_arg()]
        if s.platform_feed:
            imds_args += ["--platform-feed", processes.eventhubs_connection_string(
                self.servers["eventhubs"].port, processes.PLATFORM_HUB)]
        self.servers["imds"] = processes.start_imds(imds_args, log_dir=self.work)
        self.imds = ImdsSimulator(f"http://{processes.LOOPBACK}:{self.servers['imds'].port}")
        self.servers["webhook"] = processes.start_webhook_receiver(
            ["--record", str(self.work / "alerts.jsonl")], log_dir=self.work)
        if s.sign_in:  # the console signs in here as against Entra (authority https://127.0.0.1:<port>/<tenant>)
            self.issuer.init()
            port = processes.free_port()
            self.servers["signin"] = processes.start("signin", [
                sys.executable, "-m", "sandbox.functions.signin", str(self.issuer.directory),
                "--port", str(port),
                "--lifetime", str(s.token_lifetime)], {"https": port}, log_dir=self.work)
        # Central as several Function instances: the same settings and consumer group, so the Event Hubs
        # client's load balancing splits the hub's partitions between them (each VM's envelopes reach one
        # instance); HTTP and timer calls land on any. The State table keeps them one.
        for n in range(max(1, s.central_instances)):
            name = "functions" if n == 0 else f"functions-{n + 1}"
            self.servers[name] = self._start_runner(name)
        for vm in s.vms:
            if vm.forwarder:
                self.forwarders[vm.name] = start_forwarder(self, vm)

    def stop(self) -> None:
        """Forwarders first (they publish their last words), then central, then the stand-ins.
        A second Ctrl-C while stopping is ignored, so no child is left behind."""
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self._stop_all()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)

    def _stop_all(self) -> None:
        capture = self.settings.capture and "eventhubs" in self.servers and "azurite" in self.servers
        waves = [list(self.forwarders.values()),
                 [self.servers[n] for n in (*self.runner_names, "webhook", "signin") if n in self.servers],
                 # with Capture, the hub stops first: it writes its open windows to Azurite as it goes
                 [self.servers.pop("eventhubs")] if capture else [],
                 [self.servers[n] for n in ("imds", "eventhubs", "azurite") if n in self.servers]]
        for i, wave in enumerate(waves):
            if i == 3 and capture:
                self._save_capture()  # Azurite is in memory: keep the files before it stops
            _stop_together(wave)
        if self.imds is not None:
            self.imds.close()
        self.forwarders.clear()
        self.servers.clear()

    @property
    def capture_dir(self) -> Path:
        return self.work / "capture"

    def _save_capture(self) -> None:
        """Copy every Capture file from Azurite to <work>/capture/<blob name> (same layout as in storage)."""
        from azure.storage.blob import BlobServiceClient

        try:
            with BlobServiceClient.from_connection_string(self.storage) as service:
                container = service.get_container_client(CAPTURE_CONTAINER)
                for blob in container.list_blobs():
                    target = self.capture_dir / blob.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(container.download_blob(blob.name).readall())
        except Exception as exc:  # noqa: BLE001 - the demo still stops everything; say what is missing
            print(f"capture files not saved: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def exited(self) -> List[str]:
        """Names of children that have exited (a crash shows here before anything else does)."""
        return [f"{s.name} (exit {s.proc.returncode}, log {s.log_path})"
                for s in [*self.servers.values(), *self.forwarders.values()] if s.proc.poll() is not None]

    # ---- central: the Functions runner with a generated local settings file -------------------
    def _start_runner(self, name: str = "functions") -> processes.Server:
        s = self.settings
        values = {
            "FUNCTIONS_WORKER_RUNTIME": "python",
            "AzureWebJobsStorage": self.storage,
            "ApprovalStorage": self.storage,
            **processes.central_hub_settings(self.servers["eventhubs"].port, HUB),
            "EVENTHUB_CONSUMER_GROUP": CONSUMER_GROUP,
            "TABLE_PREFIX": TABLE_PREFIX,
            "ALERT_WEBHOOK_URL": f"{self.webhook_url}/alerts/demo",
            "ALERT_WEBHOOK_FORMAT": "generic",
            "REEVALUATE_SCHEDULE": s.reevaluate_schedule,
            "LEADER_LIVENESS_SECONDS": "60",
        }
        if s.policy is not None:  # None: no POLICY_JSON at all, as a fresh deployment has
            values["POLICY_JSON"] = json.dumps(s.policy)
        if s.authenticate:
            values["AUTHN_TRUST_PEM"] = (self.work / "attestation" / "trust.pem").read_text()
        if s.arm:  # ARM at the simulator's stand-in, with the simulator's managed-identity tokens
            imds = f"http://{processes.LOOPBACK}:{self.servers['imds'].port}"
            values.update({"ARM_ENDPOINT": imds, "ApprovalStorage__credential": "managedidentity",
                           "AZURE_POD_IDENTITY_AUTHORITY_HOST": imds})
        port = processes.free_port()
        if "signin" in self.servers:
            values["OPERATOR_CONSOLE_AUTHORITY"] = self.sign_in_authority
            # alerts link to the console on the first instance (any instance serves it)
            first = self.servers["functions"].port if "functions" in self.servers else port
            values["APP_PUBLIC_URL"] = f"http://{processes.LOOPBACK}:{first}"
        values.update(s.central_extra)
        self.settings_file.parent.mkdir(parents=True, exist_ok=True)
        self.issuer.init()
        values.update(self.issuer.app_settings())  # central validates the tokens itself too, as infra sets it
        self.tokens = {role: self.issuer.token(name, [role], object_id=oid)
                       for role, (name, oid) in OPERATORS.items()}
        self.settings_file.write_text(json.dumps(
            {"IsEncrypted": False, "Values": values, "Keys": {"host": {"default": FUNCTION_KEY}},
             "Auth": self.issuer.auth_section(enabled=s.platform_auth)}, indent=2))
        argv = [sys.executable, "-m", "sandbox.functions", "--settings", str(self.settings_file),
                "--app", "function_app", "--app-dir", str(processes.REPO), "--port", str(port)]
        return processes.start(name, argv, {"http": port}, log_dir=self.work, timeout=60,
                               env=s.runner_env.get(name))

    def restart_runner(self, name: str) -> processes.Server:
        """Central instance `name` started again (after a fault test killed it), on a new port."""
        self.servers[name] = self._start_runner(name)
        return self.servers[name]

    # ---- what the fleet knows -------------------------------------------------------------------
    def central(self, path: str, instance: int = 0) -> Any:
        """GET a route on central instance `instance` (any instance answers the same), signed in as the
        demo's Operator (health takes the function key: it is outside sign-in, as for probes)."""
        resp = self.call(path, "Operator", instance=instance)
        resp.raise_for_status()
        return resp.json()

    def call(self, path: str, role: str, body: Optional[Dict[str, Any]] = None,
             instance: int = 0) -> requests.Response:
        """GET (or POST `body`) /api/<path> on central with the demo's `role` token and the function key."""
        session = requests.Session()
        session.trust_env = False
        server = self.servers[self.runner_names[instance % len(self.runner_names)]]
        headers = {"x-functions-key": FUNCTION_KEY, "Authorization": f"Bearer {self.tokens[role]}"}
        url = f"http://{processes.LOOPBACK}:{server.port}/api/{path}"
        if body is None:
            return session.get(url, headers=headers, timeout=10)
        return session.post(url, headers=headers, json=body, timeout=30)

    def wait_until_central_knows_every_vm(self, timeout: float = 45.0) -> float:
        """Central elects leaders among the VMs it has heard from: wait for every forwarder's first
        envelope. Returns the seconds it took."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            dead = self.exited()
            if dead:
                raise RuntimeError("a process exited early: " + "; ".join(dead))
            try:
                if int(self.central("health").get("knownVms", 0)) >= len(self.agents):
                    return time.monotonic() - t0
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"central did not hear from all {len(self.agents)} forwarders within "
                           f"{timeout:g} s; see {self.work}/*/forwarder-*.log and {self.work}/functions.log")


def _stop_together(servers: List[processes.Server], timeout: float = 10.0) -> None:
    """SIGTERM each (by PID) at once, wait for all, SIGKILL any still running after `timeout`."""
    for server in servers:
        if server.proc.poll() is None:
            try:
                os.kill(server.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    for server in servers:
        try:
            server.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"{server.name} (pid {server.pid}) ignored SIGTERM for {timeout:g} s: SIGKILL",
                  file=sys.stderr)
            server.kill()


MARKER = ".sandbox-demo"  # only a directory holding this (or an empty one) is ever wiped


def _fresh_work_dir(work: Path) -> None:
    ours = work.resolve() == (processes.REPO / ".demo").resolve()  # the default, git-ignored
    if work.exists() and any(work.iterdir()) and not (work / MARKER).exists() and not ours:
        raise RuntimeError(f"{work} is not empty and was not made by the demo; choose another --work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / MARKER).write_text("made by sandbox/demo/fleet.py; wiped at each run\n")
