"""The practice fleet (`python -m sandbox.demo --serve`, `make sandbox`): the demo's processes at real time,
with a policy that leaves events pending, up until Ctrl-C. It prints what an operator on call needs: the
central URL and an Operator token that works (the function key for health), the IMDS admin URL, and
ready-to-paste commands (docs/demo.md, "The practice fleet").
tests/e2e/test_full_loop.py runs the printed commands.
"""

from __future__ import annotations

import signal
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from sandbox import processes
from sandbox.demo.fleet import FUNCTION_KEY, OPERATORS, Fleet, FleetSettings

READY = "practice fleet ready"  # the line after which every command below works (tests wait for it)
WINDOW_OPENS_IN = timedelta(hours=6)  # the web window opens well after any NotBefore (15 min at most)


def practice_policy(now: datetime) -> Dict[str, Any]:
    """db VMs: held (a person decides); web VMs: approve in a window that opens 6 h from `now` (UTC), so
    their events wait past NotBefore; everything else: the built-in defaults."""
    start = (now.astimezone(timezone.utc) + WINDOW_OPENS_IN).replace(minute=0, second=0, microsecond=0)
    end = start + timedelta(hours=2)
    return {
        "version": 1,
        "description": "make sandbox: db VMs held for a person; web VMs wait for a window that is closed now",
        "windows": {"web-nightly": {"timeZone": "UTC", "start": start.strftime("%H:%M"),
                                    "end": end.strftime("%H:%M")}},
        "rules": [
            {"name": "db-needs-a-person", "match": {"tags": {"role": "db"}, "eventTypes": [
                "Freeze", "Reboot", "Redeploy"]}, "action": "hold", "severity": "warning"},
            {"name": "web-in-window", "match": {"tags": {"role": "web"}, "eventSources": ["Platform"]},
             "action": "approve-in-window", "window": "web-nightly", "severity": "info"},
        ],
    }


def practice_settings(work: Path, now: Optional[datetime] = None) -> FleetSettings:
    """Real time (IMDS notice as in Azure: 15 min for a Reboot), the practice policy, a calmer timer."""
    return FleetSettings(work=work, time_scale=1.0, policy=practice_policy(now or datetime.now(timezone.utc)),
                         reevaluate_schedule="*/10 * * * * *", sign_in=True, token_lifetime=12 * 3600)


def commands(fleet: Fleet) -> Tuple[Dict[str, str], List[Tuple[str, str]]]:
    """(environment, [(label, command)]): what the operator pastes. Commands use the environment's names,
    so they read the same in docs/demo.md."""
    imds = f"http://{processes.LOOPBACK}:{fleet.servers['imds'].port}/admin"
    # Operators sign in (the runner emulates App Service authentication with the local test issuer): a token
    # with the Operator role that lasts a practice night; the function key is for /api/health only.
    name, object_id = OPERATORS["Operator"]
    token = fleet.issuer.token(name, ["Operator"], object_id=object_id, lifetime=12 * 3600)
    env = {"SE_CENTRAL_URL": fleet.runner_url, "SE_OPERATOR_TOKEN": token, "SE_FUNCTION_KEY": FUNCTION_KEY,
           "IMDS_ADMIN": imds}
    key = '-H "Authorization: Bearer $SE_OPERATOR_TOKEN"'
    body = '-H "Content-Type: application/json" -d \'{"reason": "%s"}\''
    script = Path(sys.executable).parent / "se-fleet"  # `make bootstrap` installs the ops wheel editable
    se_fleet = str(script) if script.exists() else f"{sys.executable} -m central.cli.se_fleet"
    new_id = f"{sys.executable} -c 'import json,sys; print(json.load(sys.stdin)[\"eventId\"])'"

    def add(body: str) -> str:  # the simulator's admin API schedules it; EVENT holds its EventId after
        return (f"EVENT=$(curl -sf -X POST -H 'Content-Type: application/json' -d '{body}' "
                f"\"$IMDS_ADMIN/events\" | {new_id}) && echo \"EVENT=$EVENT\"")

    cmds = [
        ("add-event: a Platform Reboot on vm-a (web: waits for the window, which opens after NotBefore)",
         add('{"eventType": "Reboot", "resources": ["vm-a"]}')),
        ("add-db-event: a 30 s Freeze on vm-b and vm-c (db: held by the policy until a person decides)",
         add('{"eventType": "Freeze", "resources": ["vm-b", "vm-c"], "durationInSeconds": 30}')),
        ("pending: the open events, oldest first", f'curl -s {key} "$SE_CENTRAL_URL/api/events/pending"'),
        ("event: one event with its decision history", f'curl -s {key} "$SE_CENTRAL_URL/api/events/$EVENT"'),
        ("hold", f'curl -s -X POST {key} {body % "practice: app team asked to wait"} '
                 '"$SE_CENTRAL_URL/api/events/$EVENT/hold"'),
        ("release: the policy decides it again", f'curl -s -X POST {key} {body % "practice: go ahead"} '
                                                 '"$SE_CENTRAL_URL/api/events/$EVENT/release"'),
        ("approve: now, to the leader VM (add \"hook\": true to drain first)",
         f'curl -s -X POST {key} {body % "practice: approved on call"} '
         '"$SE_CENTRAL_URL/api/events/$EVENT/approve"'),
        ("imds: what the VM sees (Started and approvedBy once approved)",
         'curl -s "$IMDS_ADMIN/events/$EVENT"'),
        ("fleet: every VM, its open events and their states (reads SE_CENTRAL_URL, SE_OPERATOR_TOKEN)",
         f"{se_fleet} status"),
    ]
    return env, cmds


def banner(fleet: Fleet, policy: Dict[str, Any]) -> str:
    env, cmds = commands(fleet)
    window = policy.get("windows", {}).get("web-nightly", {})
    lines = [
        f"central (2 instances, sender authentication on): {env['SE_CENTRAL_URL']}  "
        f"(second instance: http://{processes.LOOPBACK}:{fleet.servers['functions-2'].port})"
        if "functions-2" in fleet.servers else f"central: {env['SE_CENTRAL_URL']}",
        f"console: {fleet.console_url}  (sign in as Operator or Reader on the local issuer's page, "
        f"{fleet.sign_in_authority}: accept its self-signed certificate once)",
        f"signed in as {OPERATORS['Operator'][0]} (Operator role, local test issuer): $SE_OPERATOR_TOKEN",
        f"function key (health probes only): {env['SE_FUNCTION_KEY']}",
        f"IMDS admin:   {env['IMDS_ADMIN']}",
        f"policy: db VMs (vm-b, vm-c) held; web VM (vm-a) approved in window web-nightly "
        f"{window.get('start')}-{window.get('end')} UTC (closed now); time scale 1 (real time)",
        f"logs and settings: {fleet.work} (central/local.settings.json, functions.log, "
        "<vm>/forwarder-<vm>.log)",
        "",
        "paste into a shell (also in " + str(fleet.work / "sandbox.env") + "):",
        *[f"export {k}={v}" for k, v in env.items()],
        "",
    ]
    for label, command in cmds:
        lines += [f"# {label}", command]
    lines += ["", f"{READY}; Ctrl-C stops every process"]
    return "\n".join(lines)


def serve(work: Path, say: Callable[[str], None] = print, stop: Optional[threading.Event] = None) -> int:
    """Start, print, wait until SIGINT/SIGTERM (or `stop`), stop every PID. 0: stopped on request;
    1: it could not start or a process died."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    settings = practice_settings(work)
    fleet = Fleet(settings)
    say(f"starting the practice fleet: Azurite, Event Hubs, the IMDS simulator ({len(settings.vms)} VMs, "
        f"real time), the webhook receiver, {settings.central_instances} central instances and "
        f"{len(settings.vms)} forwarders (logs in {work})")
    try:
        fleet.start()
        fleet.wait_until_central_knows_every_vm(timeout=90)
        env, _ = commands(fleet)
        (work / "sandbox.env").write_text("".join(f"export {k}={v}\n" for k, v in env.items()))
        say(banner(fleet, settings.policy or {}))
        while not stop.wait(1.0):
            dead = fleet.exited()
            if dead:
                say("a process exited: " + "; ".join(dead) + "; stopping")
                return 1
        say("stopping every process")
        return 0
    except Exception as exc:  # noqa: BLE001 - one line, then every PID is stopped below
        say(f"the practice fleet did not start: {type(exc).__name__}: {exc}")
        return 1
    finally:
        fleet.stop()
        say("stopped")
