"""`make sandbox` (the practice fleet, `python -m sandbox.demo --serve`), typed as the README has it in a
checkout's root, driven through the commands it prints, then stopped with Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

from tests.e2e.checkout import alive, checkout_view, descendants, make_args, readme_commands, shell_env


def _practice_commands(banner: str) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(exports, {label: command}) from the printed banner: `export K=V` lines, and `# label: ...` comments
    each followed by its command."""
    env: Dict[str, str] = {}
    cmds: Dict[str, str] = {}
    lines = banner.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("export "):
            key, value = line[len("export "):].split("=", 1)
            env[key] = value
        elif line.startswith("# ") and i + 1 < len(lines):
            cmds[line[2:].split(":", 1)[0]] = lines[i + 1]
    return env, cmds


def _sh(root: Path, command: str, env: Dict[str, str], event: str = "", raw: bool = False) -> Any:
    """Run a printed command as pasted into bash at the checkout's root, in a person's shell environment with
    the banner's exports; its JSON answer (`raw`: its output)."""
    out = subprocess.run(["bash", "-c", command], cwd=root, env=shell_env({**env, "EVENT": event}),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (command, out.stdout, out.stderr)
    return out.stdout if raw else json.loads(out.stdout)


def test_make_sandbox_drives_hold_release_approve_through_its_printed_commands(tmp_path: Path) -> None:
    """`make sandbox` typed in a checkout's root: the Makefile's relative `--work .sandbox`, then Ctrl-C to
    the terminal's process group (make and the fleet both get it)."""
    assert "make sandbox" in readme_commands()
    root = checkout_view(tmp_path / "repo")
    proc = subprocess.Popen(make_args("sandbox"), cwd=root, env=shell_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    children: Set[int] = set()
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 150
        seen: List[str] = []
        while time.monotonic() < deadline and not (seen and "practice fleet ready" in seen[-1]):
            line = proc.stdout.readline()
            assert line, "the practice fleet ended before it was ready:\n" + "".join(seen)[-4000:]
            seen.append(line)
        banner = "".join(seen)
        assert "practice fleet ready" in banner, banner[-4000:]
        assert f"logs and settings: {root.resolve() / '.sandbox'}" in banner or \
            f"logs and settings: {root / '.sandbox'}" in banner, banner[-2000:]
        assert (root / ".sandbox" / "sandbox.env").exists()
        children = descendants(proc.pid)
        env, cmds = _practice_commands(banner)
        console = re.search(r"^console: (http://127\.0\.0\.1:\d+/api/console/) ", banner, re.M)
        assert console and console.group(1) == env["SE_CENTRAL_URL"] + "/api/console/", banner
        page = subprocess.run(["curl", "-sf", console.group(1)], capture_output=True, text=True, timeout=30)
        assert page.returncode == 0 and "msal-browser.min.js" in page.stdout  # the console's page
        assert set(env) == {"SE_CENTRAL_URL", "SE_OPERATOR_TOKEN", "SE_FUNCTION_KEY", "IMDS_ADMIN"}
        assert {"add-event", "add-db-event", "pending", "event", "hold", "release", "approve", "imds",
                "fleet"} <= set(cmds)

        printed = _sh(root, cmds["add-event"], env, raw=True).strip()
        assert printed.startswith("EVENT="), printed
        event = printed[len("EVENT="):]
        # the web VM's Reboot waits for a window that opens after its NotBefore: pending, no approval sent
        view: Dict[str, Any] = {}
        until = time.monotonic() + 60
        while time.monotonic() < until:
            pending = [e for e in _sh(root, cmds["pending"], env) if e["eventId"] == event]
            if pending and pending[0]["state"] not in ("new", None):
                view = pending[0]
                break
            time.sleep(1)
        assert view, "the injected event never became pending with a policy decision"
        # its window opens after its NotBefore: no approval is ever sent (issue 26: one name for it)
        assert view["state"] == "starts-at-notbefore" and view["approvals"] == [], view
        held = _sh(root, cmds["hold"], env, event)
        assert held["state"] == "held", held
        released = _sh(root, cmds["release"], env, event)
        assert released["state"] != "held", released
        approved = _sh(root, cmds["approve"], env, event)
        assert approved["state"] == "approving", approved
        until = time.monotonic() + 60
        sim: Dict[str, Any] = {}
        while time.monotonic() < until:
            sim = _sh(root, cmds["imds"], env, event)
            if sim.get("approvedBy"):
                break
            time.sleep(1)
        assert sim.get("approvedBy") == ["vm-a"] and sim["state"] in ("Started", "gone", "Gone"), sim
        history = _sh(root, cmds["event"], env, event)
        ops = [d["action"] for d in history["decisions"] if str(d["action"]).startswith("operator-")]
        assert ops == ["operator-hold", "operator-release", "operator-approve"], history["decisions"]
        # decided by the signed-in person of the printed token, never by a name a caller wrote
        olga = "operator:olga.operator@contoso.com (0c0a4f1e-5d7b-4c55-9a3e-7f2d8e6b1a01)"
        deciders = {d.get("decidedBy") for d in history["decisions"] if d["action"] in ops}
        assert deciders == {olga}, deciders
        fleet = subprocess.run(["bash", "-c", cmds["fleet"]], cwd=root, env=shell_env(env),
                               capture_output=True, text=True, timeout=60)
        assert f"{event[:8]}(approv" in fleet.stdout and fleet.returncode in (0, 1), (fleet.stdout,
                                                                                      fleet.stderr)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground job
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed assertion above: SIGINT first, so the fleet stops its children
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            for pid in children:  # anything it could not stop
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
    # make itself dies of the SIGINT once its recipe has ended (GNU make re-raises it)
    assert proc.returncode in (0, -signal.SIGINT, 130, 2), rest
    assert "stopping every process" in rest and "stopped" in rest, rest
    assert children and [pid for pid in children if alive(pid)] == []
