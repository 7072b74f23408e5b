"""Installing the forwarder on Windows: every decision install-forwarder.ps1 used to make, in Python.

The PowerShell script is left with what only Windows' own tools can do (unpack the bundle, stop and
register the scheduled task, set ACLs with icacls); it asks this module for everything else:
- `plan`: where things go (Program Files, ProgramData), the ACL commands and the task's command line,
  as JSON (the same `Layout` the daemon is started with);
- `stage`: the bundle's embeddable CPython copied to `<prefix>\\python.new`, its `._pth` edited so
  `site` (and so `Lib\\site-packages`) is on, the bundle's wheels installed into it offline with the
  bundle's own pip wheel, the result checked (`-m forwarder --version`), config.json written;
- `activate` (with the forwarder stopped): `python.new` becomes `python`, the example hooks are written;
- `uninstall [--purge]`: what the install wrote goes; the outbox and added hooks stay unless --purge.

It runs on the bundle's interpreter before anything is installed, with the forwarder's wheel on
sys.path (zip import), so it imports nothing outside the standard library at module level. Paths are
Windows paths (ntpath) whatever the platform, so the plan is unit-tested on Linux too.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import ntpath
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import exitcodes

TASK_NAME = "se-forwarder"
SERVICE_ACCOUNT = "NT AUTHORITY\\LOCAL SERVICE"
TASK_USER = "LOCAL SERVICE"
HOST_SCRIPT = "run-forwarder.ps1"
BUNDLE_NEEDS = ("python", "wheels", "requirements-vm.txt", HOST_SCRIPT)
COPIED = (HOST_SCRIPT, "requirements-vm.txt", "forwarder.md")
# SIDs, not names (names are localized): SYSTEM, Administrators, LOCAL SERVICE.
SYSTEM, ADMINS, LOCAL_SERVICE = "*S-1-5-18", "*S-1-5-32-544", "*S-1-5-19"
PIP_TIMEOUT = 900
# How install-forwarder.ps1 runs this module before anything is installed: the bundle's interpreter with
# the forwarder's wheel first on sys.path (`python.exe -c BOOTSTRAP <wheel> <step> ...`).
BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
             "from forwarder.windows_install import main; sys.exit(main())")


class InstallError(Exception):
    """The install cannot go on; the message says what to fix."""


@dataclass(frozen=True)
class Layout:
    """Where the forwarder lives on a Windows VM."""

    prefix: str       # program: read-only for the service account
    data_dir: str     # config and hooks: read-only for the service account
    state_dir: str    # outbox, ledger, log: writable by it
    hook_dir: str
    config_path: str
    python_dir: str
    python_exe: str
    log_path: str

    @property
    def staged_python_dir(self) -> str:
        return self.python_dir + ".new"


def _env(env: Mapping[str, str], name: str, default: str) -> str:
    """Windows variable names are case-insensitive (os.environ upper-cases them)."""
    upper = {k.upper(): v for k, v in env.items()}
    return upper.get(name.upper()) or default


def layout(env: Mapping[str, str]) -> Layout:
    prefix = ntpath.join(_env(env, "ProgramFiles", "C:\\Program Files"), "se-forwarder")
    data = ntpath.join(_env(env, "ProgramData", "C:\\ProgramData"), "se-forwarder")
    state = ntpath.join(data, "state")
    python_dir = ntpath.join(prefix, "python")
    return Layout(prefix=prefix, data_dir=data, state_dir=state, hook_dir=ntpath.join(data, "hooks"),
                  config_path=ntpath.join(data, "config.json"), python_dir=python_dir,
                  python_exe=ntpath.join(python_dir, "python.exe"),
                  log_path=ntpath.join(state, "forwarder.log"))


def daemon_command(where: Layout) -> List[str]:
    """What the service host starts (run-forwarder.ps1 adds nothing but output redirection)."""
    return [where.python_exe, "-m", "forwarder", "run", "--config", where.config_path]


def task_arguments(where: Layout) -> Dict[str, str]:
    """The scheduled task's action: PowerShell running the service host with the layout's paths."""
    host = ntpath.join(where.prefix, HOST_SCRIPT)
    return {
        "execute": "powershell.exe",
        "argument": (f'-NoProfile -NonInteractive -ExecutionPolicy Bypass -File "{host}" '
                     f'-Python "{where.python_exe}" -Config "{where.config_path}" '
                     f'-StateDir "{where.state_dir}"'),
    }


def acl_commands(where: Layout) -> List[List[str]]:
    """icacls runs: program and config read-only for the service account, the state writable by it."""
    full = [f"{SYSTEM}:(OI)(CI)F", f"{ADMINS}:(OI)(CI)F", f"{LOCAL_SERVICE}:(OI)(CI)RX"]
    return [
        ["icacls", where.prefix, "/inheritance:r", "/grant:r", *full],
        ["icacls", where.data_dir, "/inheritance:r", "/grant:r", *full],
        ["icacls", where.state_dir, "/grant:r", f"{LOCAL_SERVICE}:(OI)(CI)M"],
    ]


def plan(where: Layout) -> Dict[str, Any]:
    """Everything install-forwarder.ps1 needs to know, as one JSON-able object."""
    return {
        "layout": asdict(where),
        "stagedPythonDir": where.staged_python_dir,
        "daemon": daemon_command(where),
        "task": {"name": TASK_NAME, "user": TASK_USER, "account": SERVICE_ACCOUNT,
                 "description": f"Azure Scheduled Events forwarder (service host: {HOST_SCRIPT})",
                 **task_arguments(where)},
        "acl": acl_commands(where),
    }


def enable_site(pth: str) -> str:
    """The embeddable CPython's `python3XX._pth` with `import site` on (site-packages importable).
    Everything else is kept: the file replaces PYTHONPATH, so nothing from the VM's environment leaks in."""
    lines = [line.rstrip("\r") for line in pth.splitlines()]
    out = ["import site" if line.strip() in ("#import site", "# import site") else line for line in lines]
    if "import site" not in (line.strip() for line in out):
        out.append("import site")
    return "\r\n".join(out) + "\r\n"


def config_text(raw: bytes, where: Layout) -> str:
    """The config file: the given JSON object, plus this layout's state and hook directories unless it
    names its own (so `se-forwarder approve --config ...` finds the daemon's ledger and hooks)."""
    try:
        value = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InstallError(f"the configuration is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InstallError("the configuration must be a JSON object ({\"setting\": value, ...})")
    value.setdefault("state_dir", where.state_dir)
    value.setdefault("hook_dir", where.hook_dir)
    return json.dumps(value, indent=2) + "\n"


def decode_config(config_base64: Optional[str], config_file: Optional[str]) -> bytes:
    if config_base64:
        try:
            return base64.b64decode(config_base64, validate=True)
        except (binascii.Error, ValueError):
            raise InstallError("--config-base64 is not valid base64") from None
    if config_file:
        try:
            return Path(config_file).read_bytes()
        except OSError as exc:
            raise InstallError(f"cannot read --config-file {config_file}: {exc.strerror or exc}") from None
    raise InstallError("give --config-base64 or --config-file")


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def _run(runner: Runner, command: Sequence[str], what: str) -> str:
    done = runner(list(command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                  stderr=subprocess.STDOUT, text=True, timeout=PIP_TIMEOUT)
    if done.returncode != 0:
        tail = (done.stdout or "").strip().splitlines()[-5:]
        raise InstallError(f"{what} failed (exit {done.returncode}): {' | '.join(tail)}")
    return done.stdout or ""


def _one(directory: Path, pattern: str, what: str) -> Path:
    found = sorted(directory.glob(pattern))
    if len(found) != 1:
        raise InstallError(f"the bundle should hold exactly one {what} ({pattern}); found {len(found)}")
    return found[0]


def stage(bundle: Path, where: Layout, config: bytes, runner: Runner = subprocess.run) -> str:
    """Build `<prefix>\\python.new` from an unpacked bundle and write the config; the running forwarder
    is untouched. Returns the staged forwarder's version line."""
    missing = [name for name in BUNDLE_NEEDS if not (bundle / name).exists()]
    if missing:
        raise InstallError(f"the bundle is incomplete: {', '.join(missing)} missing")
    text = config_text(config, where)  # checked before anything is written
    for d in (where.prefix, where.state_dir, ntpath.join(where.hook_dir, "pre-approve.d"),
              ntpath.join(where.hook_dir, "post-event.d")):
        Path(d).mkdir(parents=True, exist_ok=True)
    staged = Path(where.staged_python_dir)
    if staged.exists():
        shutil.rmtree(staged)
    # copyfile, not copy2: content is all the install needs, and copy2's CopyFile2 (Python 3.12+ on
    # Windows) is missing from Wine 8.0, where the tests run this
    shutil.copytree(bundle / "python", staged, copy_function=shutil.copyfile)
    pth = _one(staged, "python3*._pth", "interpreter path file")
    pth.write_text(enable_site(pth.read_text(encoding="utf-8")), encoding="utf-8", newline="")
    python = str(staged / "python.exe")
    pip = _one(bundle / "wheels", "pip-*.whl", "pip wheel")
    wheels = bundle / "wheels"
    _run(runner, [python, str(pip / "pip"), "install", "--quiet", "--no-index", "--disable-pip-version-check",
                  "--no-warn-script-location", "--find-links", str(wheels),
                  "-r", str(bundle / "requirements-vm.txt"), "scheduled-events-forwarder"],
         "installing the bundle's wheels (does the bundle match this interpreter?)")
    version = _run(runner, [python, "-m", "forwarder", "--version"], "the staged forwarder").strip()
    # pip's launchers (Scripts\*.exe) name the interpreter they were built by, python.new\python.exe,
    # which `activate` renames away: none of them could start. The command is `python.exe -m forwarder`.
    shutil.rmtree(staged / "Scripts", ignore_errors=True)
    for name in COPIED:
        if (bundle / name).exists():
            shutil.copyfile(bundle / name, Path(where.prefix) / name)
    tmp = Path(where.config_path + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, where.config_path)
    return version


def activate(where: Layout) -> List[str]:
    """With the forwarder stopped: the staged interpreter replaces the running one; the example hooks
    are written (existing files kept). Returns the example hooks written."""
    staged, live = Path(where.staged_python_dir), Path(where.python_dir)
    if not staged.is_dir():
        raise InstallError(f"nothing staged at {staged}: run `stage` first")
    if live.exists():
        shutil.rmtree(live)
    staged.rename(live)
    from .hooks import install_examples

    return [str(p) for p in install_examples(where.hook_dir, windows=True)]


def uninstall(where: Layout, purge: bool) -> List[str]:
    """The reverse of the install (the forwarder already stopped and its task gone); safe to run twice.
    Returns what was removed."""
    removed = []
    if Path(where.prefix).exists():
        shutil.rmtree(where.prefix)
        removed.append(where.prefix)
    if purge:
        if Path(where.data_dir).exists():
            shutil.rmtree(where.data_dir)
            removed.append(where.data_dir)
        return removed
    if Path(where.config_path).exists():
        os.remove(where.config_path)
        removed.append(where.config_path)
    for example in sorted(Path(where.hook_dir).rglob("*.example")):
        example.unlink()
        removed.append(str(example))
    return removed


def main(argv: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="se-forwarder windows-install",
        description="The Windows install's steps (install-forwarder.ps1 runs them).")
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("plan", help="print the layout, the ACL commands and the task's command line (JSON)")
    staging = sub.add_parser("stage", help="build <prefix>\\python.new from an unpacked bundle; "
                             "write config.json")
    staging.add_argument("--bundle", required=True, help="the unpacked se-forwarder-windows.zip")
    staging.add_argument("--config-base64", default="")
    staging.add_argument("--config-file", default="")
    sub.add_parser("activate", help="with the forwarder stopped: python.new becomes python; example hooks")
    removing = sub.add_parser("uninstall", help="remove what the install wrote (the task already gone)")
    removing.add_argument("--purge", action="store_true", help="also the config, hooks and the outbox")
    args = parser.parse_args(list(argv) if argv is not None else None)
    where = layout(os.environ if env is None else env)
    try:
        if args.step == "plan":
            print(json.dumps(plan(where), indent=2))
        elif args.step == "stage":
            config = decode_config(args.config_base64, args.config_file)
            print(f"staged {stage(Path(args.bundle), where, config)} in {where.staged_python_dir}")
        elif args.step == "activate":
            written = activate(where)
            print(f"active: {where.python_dir}; {len(written)} example hook(s) written")
        else:
            for path in uninstall(where, args.purge):
                print(f"removed {path}")
    except InstallError as exc:
        print(f"se-forwarder windows-install: error: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except BrokenPipeError:
        raise  # the reader went away (`... plan | head`): cli's closed-pipe handling
    except OSError as exc:
        print(f"se-forwarder windows-install: error: {exc.strerror or exc}: {exc.filename or ''}",
              file=sys.stderr)
        return exitcodes.STATE
    return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
