"""The forwarder's footprint at 1 Hz polling, side by side with a minimal reference poller, in one run.

    python -m bench.forwarder_footprint [--runs 3] [--seconds 120] [--warmup 20] [--write]

Agents, each a process polling its own VM of ONE IMDS simulator (so IMDS's per-VM limit never couples
them), all started together per run and measured over the same window:
- forwarder, file sink: `--sink file`, no approval queue;
- forwarder, production: the Event Hubs sink over TLS with managed identity, the approval queue over
  HTTPS with managed identity (tokens from the simulator's IMDS token endpoint), heartbeats every 60 s,
  in the environment infra/forwarder/se-forwarder.service gives it (MALLOC_ARENA_MAX=1 ...);
  Since issue 22 it signs every envelope (authenticate is on by default with that sink);
- forwarder, production --no-authenticate: the same without signing (forwarder/attestation.py unused);
- forwarder, production --eventhub-idle-close 0: the same keeping its Event Hubs connection open (the
  default releases it after 20 s without a send and reconnects for the next heartbeat);
- reference poller (requests) and reference poller (http.client): bench/reference_poller.py.

The pinned VM install: the forwarders and the http.client reference run on `.venv-vm`, a venv made here
from infra/forwarder/requirements-vm.txt alone (the wheelhouse's exact pins; rebuilt when the lock
changes), the forwarder from this source tree (`python -m forwarder`, cwd = the repository), no dev
packages.

Managed identity, as in Azure: the sandbox Event Hubs server (its REST send endpoint) and Azurite speak
plain HTTP, but a bearer token is only ever sent over TLS (so does Azurite's OAuth). So Azurite runs with
`--oauth basic --cert/--key` (HTTPS; it checks the token's shape, audience, issuer and lifetime, not its
signature), and a TLS relay (bench/tlsrelay.py) on 127.0.0.13:443, a loopback address of its own named as
the namespace, fronts the server's REST endpoint. One certificate is made per run and trusted by the
agents only: SSL_CERT_DIR (a hashed CA directory holding it: the forwarder's TLS context looks there, as
it looks in the VM's /etc/ssl/certs) and REQUESTS_CA_BUNDLE. Binding port 443 needs root (this machine's
benches run as root). The requests reference poller runs on `.venv-vm-requests`: the same lock plus
requests and its four packages (REFERENCE_PINS). Not one venv for all: jsonschema imports `idna` for its
idn-hostname check whenever it is installed (+0.15 MiB beside jsonschema, measured alone), which a VM
never has: the forwarders run on exactly the VM lock.

Two states per run, every agent measured side by side in each: idle (after the warm-up), then with
an event open: a Reboot naming every agent's VM, Scheduled for an hour and never approved (the
production forwarders then carry the approval parts and poll the queue over REST).
Per agent, state and run: RSS sampled every second from /proc/<pid>/status (VmRSS) over the window,
its median = the steady RSS; CPU = user+system seconds over the window, the agent's own and its finished
children's (the daemon's schema checks run in a child process: forwarder/validation.py), scaled to an
hour. Printed: median [min-max] of the runs, in MiB and CPU s/hour, and each agent's ratio to the
reference poller (requests) measured in the same runs and state. Goals for "forwarder, production"
(signing): <= 30 MiB idle and <= 33 MiB with the event open (issue 49), CPU <= the requests reference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench import Figure, median, record, spread_figure
from bench.tlsrelay import TlsRelay, make_certificate
from sandbox import processes

MIB = 1024 * 1024
VENV = processes.REPO / ".venv-vm"
REFERENCE_VENV = processes.REPO / ".venv-vm-requests"
LOCK = processes.REPO / "infra" / "forwarder" / "requirements-vm.txt"
UNIT = processes.REPO / "infra" / "forwarder" / "se-forwarder.service"
RESULTS = Path(__file__).resolve().parent / "results" / "forwarder_footprint.md"
# The namespace's HTTPS port on a loopback address of its own: the REST sink sends to https://<namespace>/.
HUB_HOST, HUB_PORT = "127.0.0.13", 443
# The requests reference poller's packages (the VM lock's pins before issue 49; the forwarder never
# imports them): installed next to the lock so the reference stays the same program as before.
REFERENCE_PINS = ("requests==2.32.5", "urllib3==2.6.3", "idna==3.20", "certifi==2026.10.18",
                  "charset-normalizer==3.5.2")
HUB = "scheduled-events"
IDLE, EVENT = "idle", "event open"
# issue 22 point 6: the production forwarder (signing) <= 40 MiB and <= 8 s CPU/hour idle, <= 45 MiB with
# an event naming the VM open.
# issue 49: <= 30 MiB idle, <= 33 MiB with the event open (CPU: <= the requests reference, same run).
GOALS = {IDLE: (30.0, 8.0), EVENT: (33.0, 0.0)}
PRODUCTION = "forwarder, production"
REPEATS_INSIDE = True  # --runs (default 3): its figures are medians with their range
REFERENCE = "reference poller (requests)"


@dataclass
class Agent:
    label: str
    vm: str
    argv: List[str]
    env: Dict[str, str] = field(default_factory=dict)
    proc: Optional[subprocess.Popen] = None
    state: Optional[Path] = None


def vm_python(venv: Path = VENV, extra: Sequence[str] = ()) -> Path:
    """`<venv>/bin/python` with exactly the VM lock's pins and `extra` (made or remade when they changed)."""
    digest = hashlib.sha256(LOCK.read_bytes() + " ".join(extra).encode()).hexdigest()
    stamp = venv / ".lock-sha256"
    python = venv / "bin" / "python"
    if not (python.exists() and stamp.exists() and stamp.read_text() == digest):
        print(f"bench: building {venv.name} from {LOCK.relative_to(processes.REPO)} (once per lock)",
              flush=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps", "-r", str(LOCK), *extra], check=True, timeout=900)
        stamp.write_text(digest)
    return python


def unit_env(unit: Path = UNIT) -> Dict[str, str]:
    """The environment the systemd unit gives the forwarder (its Environment= lines), but the state
    directory, which each agent has its own of: what a production install runs with."""
    env = {}
    for line in unit.read_text(encoding="utf-8").splitlines():
        if line.startswith("Environment="):
            name, _, value = line[len("Environment="):].partition("=")
            env[name] = value
    env.pop("SE_FORWARDER_STATE_DIR", None)
    return env


def production_args(namespace: str, queue_port: int) -> List[str]:
    """A production forwarder's sink and queue: Event Hubs' REST send and the approval queue, both over
    HTTPS with the managed identity (the footprint and soak benches' one definition of it)."""
    return ["--sink", "eventhub", "--eventhub-namespace", namespace, "--eventhub-name", HUB,
            "--queue-service-uri", f"https://{processes.LOOPBACK}:{queue_port}/devstoreaccount1"]


def production_env(identity_url: str) -> Dict[str, str]:
    """A production forwarder's environment: the unit's, and the managed-identity endpoint (the IMDS
    simulator's token endpoint for this VM)."""
    return {**unit_env(), "AZURE_POD_IDENTITY_AUTHORITY_HOST": identity_url}


def trust_env(cert: Path, work: Path) -> Dict[str, str]:
    """The environment that makes the agents (only) trust the run's certificate."""
    digest = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(cert)], capture_output=True,
                            text=True, check=True, timeout=30).stdout.strip()
    cadir = work / "ca"
    cadir.mkdir(exist_ok=True)
    (cadir / f"{digest}.0").write_bytes(cert.read_bytes())  # OpenSSL's hashed-directory name
    return {"SSL_CERT_DIR": str(cadir), "REQUESTS_CA_BUNDLE": str(cert)}


def agents(python: Path, reference_python: Path, imds_port: int, queue_port: int, work: Path) -> List[Agent]:
    def url(vm: str) -> str:
        return f"http://{processes.LOOPBACK}:{imds_port}/vms/{vm}"

    def forwarder(label: str, vm: str, extra: Sequence[str], production: bool = True) -> Agent:
        state = work / vm
        env = production_env(url(vm)) if production else {}
        argv = [str(python), "-m", "forwarder", "run", "--config", str(work / "empty.json"),
                "--imds-url", url(vm), "--state-dir", str(state), "--poll-interval", "1",
                "--log-level", "warning", *extra]
        return Agent(label, vm, argv, env, state=state)

    production = production_args(HUB_HOST, queue_port)
    return [
        forwarder("forwarder, file sink", "vm0", ["--sink", "file", "--sink-file", str(work / "vm0.jsonl")],
                  production=False),
        # the default since issue 22: the Event Hubs sink signs every envelope (authenticate on)
        forwarder("forwarder, production", "vm1", production),
        forwarder("forwarder, production --no-authenticate", "vm2", [*production, "--no-authenticate"]),
        # what releasing the idle connection (eventhub_idle_close, 20 s by default) costs the VM
        forwarder("forwarder, production --eventhub-idle-close 0", "vm5",
                  [*production, "--eventhub-idle-close", "0"]),
        Agent(REFERENCE, "vm3", [str(reference_python), "-m", "bench.reference_poller", "--url", url("vm3"),
                                 "--state", str(work / "vm3"), "--http", "requests"]),
        Agent("reference poller (http.client)", "vm4", [str(python), "-m", "bench.reference_poller", "--url",
                                                       url("vm4"), "--state", str(work / "vm4")]),
    ]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime + stime, and cutime + cstime: the children it waited for (schema checks, hooks) are its cost
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def measure(team: List[Agent], seconds: float) -> Dict[str, Dict[str, float]]:
    """Each agent's RSS (1 s samples: median and max) and CPU over one window of `seconds`."""
    for agent in team:
        if agent.proc is None or agent.proc.poll() is not None:
            raise RuntimeError(f"{agent.label} exited early; see its log")
    samples: Dict[str, List[int]] = {a.label: [] for a in team}
    cpu0 = {a.label: cpu_seconds(a.proc.pid) for a in team if a.proc}
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        for agent in team:
            assert agent.proc is not None
            samples[agent.label].append(rss_bytes(agent.proc.pid))
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    window = time.monotonic() - t0
    figures = {}
    for agent in team:
        assert agent.proc is not None
        figures[agent.label] = {"rss": median(samples[agent.label]) / MIB,
                                "rss_max": max(samples[agent.label]) / MIB,
                                "cpu": (cpu_seconds(agent.proc.pid) - cpu0[agent.label]) / window * 3600}
    return figures


def _admin(imds_port: int, path: str, body: Dict[str, Any], expect: int) -> Dict[str, Any]:
    request = urllib.request.Request(f"http://{processes.LOOPBACK}:{imds_port}/admin/{path}",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        if response.status != expect:
            raise RuntimeError(f"the simulator answered {response.status} to POST /admin/{path}")
        return json.loads(response.read() or b"{}")


def open_event(imds_port: int, team: List[Agent]) -> str:
    """A Reboot naming every agent's VM, Scheduled for an hour (no approval comes: it stays open).
    Returns its EventId (cancelled at the end of the run, so the next run starts idle)."""
    event = _admin(imds_port, "events", {"eventType": "Reboot", "resources": [a.vm for a in team],
                                         "noticeSeconds": 3600}, 201)
    return str(event["eventId"])


def one_run(number: int, pythons: Tuple[Path, Path], imds_port: int, queue_port: int,
            args: argparse.Namespace, base_env: Dict[str, str]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """{state: {agent: figures}} for the two states, idle then with an event open, in one run."""
    work = Path(tempfile.mkdtemp(prefix=f"footprint-{number}-"))
    (work / "empty.json").write_text("{}")
    team = agents(*pythons, imds_port, queue_port, work)
    logs = []
    states: Dict[str, Dict[str, Dict[str, float]]] = {}
    event = ""
    try:
        for agent in team:
            log = open(work / f"{agent.vm}.log", "wb")
            logs.append(log)
            agent.proc = subprocess.Popen(agent.argv, cwd=processes.REPO, stdout=log,
                                          stderr=subprocess.STDOUT, env={**base_env, **agent.env})
        time.sleep(args.warmup)  # imports, identity, first token, first send, first heartbeat
        states[IDLE] = measure(team, args.seconds)
        event = open_event(imds_port, team)
        time.sleep(args.event_warmup)  # the incarnation sent, the approval parts and the queue SDK loaded
        states[EVENT] = measure(team, args.seconds)
    finally:
        if event:
            _admin(imds_port, f"events/{event}/cancel", {}, 200)
        for agent in team:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.send_signal(signal.SIGTERM)
        for agent in team:
            if agent.proc is not None:
                try:
                    agent.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    agent.proc.kill()
        for log in logs:
            log.close()
    for agent in team:  # the production forwarders must really have published: else the figure is moot
        if agent.state is not None and "production" in agent.label:
            backlog, error = outbox_health(agent.state)
            if backlog or error:
                raise RuntimeError(f"{agent.label} did not publish (backlog {backlog}, last error {error}); "
                                   f"see {work / (agent.vm + '.log')}")
    return states


def outbox_health(state: Path) -> tuple:
    db = sqlite3.connect(f"file:{state / 'outbox.sqlite3'}?mode=ro", uri=True, timeout=10)
    try:
        backlog = db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
        row = db.execute("SELECT value FROM state WHERE key = 'last_error'").fetchone()
        return backlog, json.loads(row[0]) if row else None
    finally:
        db.close()


def summary(runs: List[Dict[str, Dict[str, float]]]) -> List[str]:
    labels = list(runs[0])
    ref_rss = median([r[REFERENCE]["rss"] for r in runs])
    ref_cpu = median([r[REFERENCE]["cpu"] for r in runs])
    rows = ["| agent | steady RSS (MiB) | max RSS (MiB) | CPU (s per hour) | RSS / reference "
            "| CPU / reference |", "|---|---|---|---|---|---|"]
    for label in labels:
        rss = [r[label]["rss"] for r in runs]
        peak = [r[label]["rss_max"] for r in runs]
        cpu = [r[label]["cpu"] for r in runs]
        rows.append(f"| {label} | {median(rss):.1f} [{min(rss):.1f}-{max(rss):.1f}] | {median(peak):.1f} | "
                    f"{median(cpu):.1f} [{min(cpu):.1f}-{max(cpu):.1f}] | {median(rss) / ref_rss:.2f} | "
                    f"{median(cpu) / ref_cpu:.2f} |")
    return rows


def tables(runs: List[Dict[str, Dict[str, Dict[str, float]]]]) -> List[str]:
    lines: List[str] = []
    for state in (IDLE, EVENT):
        lines += [f"{state} (goal for the production forwarder: RSS <= {GOALS[state][0]:g} MiB"
                  + (f", CPU <= {GOALS[state][1]:g} s/hour" if GOALS[state][1] else "") + "):", "",
                  *summary([r[state] for r in runs]), ""]
    return lines


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forwarder_footprint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=120.0, help="measured window per run")
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--event-warmup", type=float, default=15.0,
                        help="seconds between opening the event and measuring that state")
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(processes.REPO)}")
    args = parser.parse_args(argv)
    pythons = (vm_python(), vm_python(REFERENCE_VENV, REFERENCE_PINS))
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("SE_FORWARDER_", "PYTHON"))}
    runs: List[Dict[str, Dict[str, Dict[str, float]]]] = []
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cert, key = make_certificate(work, (processes.LOOPBACK, HUB_HOST))
        base_env.update(trust_env(cert, work))
        vms = [arg for i in range(6) for arg in ("--vm", f"vm{i}")]
        imds = processes.start_imds(["--time-scale", "1", *vms], log_dir=work)
        hub = processes.start_eventhubs([f"{HUB}=4"], log_dir=work, rest=True)
        azurite = processes.start_azurite(log_dir=work, oauth_tls=(cert, key))
        azurite.grace = 2.0
        relay = TlsRelay(cert, key, hub.ports["rest"], host=HUB_HOST, port=HUB_PORT)
        try:
            for number in range(1, args.runs + 1):
                print(f"run {number}/{args.runs}: {args.warmup:g} s warm-up, {args.seconds:g} s measured",
                      flush=True)
                runs.append(one_run(number, pythons, imds.port, azurite.ports["queue"], args, base_env))
        finally:
            relay.stop()
            for server in (azurite, hub, imds):
                server.stop()
    rows = tables(runs)
    print("\n".join(rows))
    name = "forwarder_footprint"
    figures = []
    for state in (IDLE, EVENT):
        goal_rss, goal_cpu = GOALS[state]
        production = [r[state][PRODUCTION] for r in runs]
        rss, cpu = median([p["rss"] for p in production]), median([p["cpu"] for p in production])
        print(f"production forwarder, {state}: {rss:.1f} MiB (goal <= {goal_rss:g}), {cpu:.1f} s CPU/hour"
              + (f" (goal <= {goal_cpu:g})" if goal_cpu else ""))
        for label in runs[0][state]:
            rss_m = median([r[state][label]["rss"] for r in runs])
            cpu_m = median([r[state][label]["cpu"] for r in runs])
            goal = label == PRODUCTION
            cpu_goal = goal and bool(goal_cpu)
            figures += [
                spread_figure(Figure(name, f"RSS, {state} ({label})", 0, "MiB",
                                     f"<= {goal_rss:g}" if goal else "", rss_m <= goal_rss if goal else None),
                              [round(r[state][label]["rss"], 1) for r in runs]),
                spread_figure(Figure(name, f"CPU per hour at 1 Hz, {state} ({label})", 0, "s/h",
                                     f"<= {goal_cpu:g}" if cpu_goal else "",
                                     cpu_m <= goal_cpu if cpu_goal else None),
                              [round(r[state][label]["cpu"], 1) for r in runs]),
            ]
    if args.write:
        write(rows, args, time.time() - started)
    record(figures)
    return 0


def write(rows: List[str], args: argparse.Namespace, took: float) -> None:
    from bench import report

    machine = report.machine()
    lines = ["# Forwarder footprint (bench/forwarder_footprint.py)", "",
             f"- Command: `python -m bench.forwarder_footprint --runs {args.runs} --seconds {args.seconds:g} "
             f"--warmup {args.warmup:g} --event-warmup {args.event_warmup:g} --write` "
             f"(took {took / 60:.1f} min)",
             f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {report._commit()}",
             *(f"- {k}: {v}" for k, v in machine.items()),
             "- Shared machine: other work ran on it at the same time.", "",
             f"{args.runs} runs, each: {args.warmup:g} s warm-up, {args.seconds:g} s idle, then a Reboot "
             f"naming every agent's VM opened (Scheduled, no approval), {args.event_warmup:g} s, "
             f"{args.seconds:g} s measured; all agents side by side on one IMDS simulator at 1 Hz; "
             "median [min-max] of the runs. "
             "Steady RSS = the median of a run's 1 s samples.",
             "",
             *rows, ""]
    RESULTS.write_text("\n".join(lines), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
