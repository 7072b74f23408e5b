"""Run the README's commands as a newcomer types them: `make demo ...`, `make sandbox`, `.venv/bin/se-policy
... .demo/envelopes.jsonl`, from the root of a checkout, with the Makefile's own relative folders.

The checkout is a copy of this repository's files (as a clone has them; its own empty `.demo` and
`.sandbox`), so a test's work folders never touch the developer's own, and what runs is the real Makefile.
Only what `make bootstrap` installed is linked, not copied (`.venv`, `node_modules`: `make test` has
bootstrapped both, and the copy keeps the files' times, so make finds its stamps current).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Set

from sandbox import processes

OWN = {".demo", ".sandbox", ".git", ".state", ".any-date", "wheelhouse"}  # the commands' own, or not needed
INSTALLED = {".venv", ".venv-checkov", "node_modules"}  # linked: what `make bootstrap` installed
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".ruff_cache", ".hypothesis")


def checkout_view(dest: Path) -> Path:
    """A checkout root at `dest`: this repository's files copied (times kept), its installs linked. The
    installs must be current (`make test` makes them so): a stale stamp would make `make` rebuild the linked
    `.venv` or `node_modules` of this repository. The venv's console scripts (se-policy, se-fleet) run this
    repository's code, which the copy is identical to."""
    stale = subprocess.run(["make", "-q", "bootstrap"], cwd=processes.REPO, env=shell_env(),
                           capture_output=True, check=False)
    assert stale.returncode == 0, "`make bootstrap` first: the installs the checkout links are out of date"
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(processes.REPO.iterdir()):
        if entry.name in OWN or (dest / entry.name).exists():
            continue
        if entry.name in INSTALLED:
            (dest / entry.name).symlink_to(entry)
        elif entry.is_dir():
            shutil.copytree(entry, dest / entry.name, symlinks=True, ignore=SKIP)
        else:
            shutil.copy2(entry, dest / entry.name)
    return dest


def shell_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a person's shell: no make jobserver or level inherited from `make test`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    env.update(extra or {})
    return env


def typed(root: Path, command: str, timeout: float) -> subprocess.CompletedProcess:
    """One command line as typed at a bash prompt in the checkout's root."""
    return subprocess.run(["bash", "-c", command], cwd=root, env=shell_env(), capture_output=True, text=True,
                          timeout=timeout)


def make_args(target: str, demo_args: Optional[List[str]] = None) -> List[str]:
    """`make TARGET [DEMO_ARGS="..."]` as the README writes it (-s only quiets make's own echo)."""
    argv = ["make", "-s", target]
    if demo_args:
        argv.append("DEMO_ARGS=" + " ".join(demo_args))
    return argv


def descendants(pid: int) -> Set[int]:
    found: Set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += list(kids - found)
            found |= kids
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def readme_commands() -> List[str]:
    """Every command line of the README's shell blocks (comments and the diagram left out)."""
    out: List[str] = []
    inside = False
    for line in (processes.REPO / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```sh"
            continue
        if inside and line.strip() and not line.startswith(" "):
            out.append(line.split("  #", 1)[0].split(" # ", 1)[0].strip())
    return out


def run_to_end(argv: List[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run a command as a terminal's foreground job; past `timeout`, Ctrl-C the whole job (make, the demo
    and every process it started), then kill what is left, and raise TimeoutExpired."""
    proc = subprocess.Popen(argv, cwd=cwd, env=shell_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
