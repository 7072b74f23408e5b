"""Local hooks: executables an operator drops in the hook directory, run before approvals and after events.

Layout (run-parts style): `<hook_dir>/pre-approve.d/*` and `<hook_dir>/post-event.d/*`, run one after
another in name order. A hook sees the event in its environment (SE_EVENT_ID, ...), never the
forwarder's own environment (which may hold a connection string): on Linux a fixed root-owned PATH, on
Windows the system's own PATH and variables (SystemRoot, ComSpec, ...; `base_environment`). Only
regular executable files owned by root or the service user and not group- or world-writable are run:
anyone who can write a hook can decide when this VM reboots. A hook that outlives the timeout is killed
with its whole process group. Files ending in `.example` are documentation (the install ships commented
examples that way) and are never run; `install_examples` copies the packaged ones into a hook directory.

Whatever IMDS sends reaches a hook only as text an environment can hold: a NUL byte, a lone UTF-16
surrogate or any other unencodable character in an event field is replaced (U+FFFD), so no IMDS
string can turn a valid approval into an exception.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .approvals.settings import DEFAULT_HOOK_DIR, HookSettings

log = logging.getLogger(__name__)
__all__ = ["DEFAULT_HOOK_DIR", "HookResult", "HookRun", "HookSettings", "Survey", "run_phase", "survey"]

PRE_APPROVE = "pre-approve"
POST_EVENT = "post-event"
PHASES = (PRE_APPROVE, POST_EVENT)
# Hooks run with this PATH, not the service's: a predictable, root-owned search path.
HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Windows: the system's own PATH as a fresh install sets it (so `hostname`, `powershell`, `shutdown`
# resolve by name), under the SystemRoot the service runs with.
WINDOWS_HOOK_PATH = ("{root}\\system32;{root};{root}\\System32\\Wbem;"
                     "{root}\\System32\\WindowsPowerShell\\v1.0\\")
# The system variables a Windows program expects (cmd, PowerShell, .NET read them); none is a secret.
WINDOWS_PASSED = ("SystemRoot", "windir", "SystemDrive", "ComSpec", "PATHEXT", "ProgramData",
                  "ProgramFiles", "ProgramFiles(x86)", "ProgramW6432", "CommonProgramFiles",
                  "CommonProgramFiles(x86)", "CommonProgramW6432", "ALLUSERSPROFILE", "PUBLIC",
                  "NUMBER_OF_PROCESSORS", "PROCESSOR_ARCHITECTURE", "OS", "COMPUTERNAME",
                  "TEMP", "TMP", "USERPROFILE", "USERNAME")


@dataclass
class HookResult:
    """One hook's run (or refusal)."""

    name: str
    exitCode: Optional[int] = None
    timedOut: bool = False
    refused: Optional[str] = None
    seconds: float = 0.0
    output: str = ""
    outputTruncated: bool = False

    @property
    def ok(self) -> bool:
        return self.refused is None and not self.timedOut and self.exitCode == 0


@dataclass
class HookRun:
    """Every hook of one phase for one event. `ok` only if each ran and exited 0."""

    phase: str
    directory: str
    results: List[HookResult] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def ran(self) -> int:
        return sum(1 for r in self.results if r.refused is None)

    def failure(self) -> str:
        """A one-line reason naming the first failed hook ('' when ok)."""
        for r in self.results:
            if r.refused is not None:
                return f"{self.phase} hook {r.name} refused: {r.refused}"
            if r.timedOut:
                return f"{self.phase} hook {r.name} timed out after {r.seconds:.1f}s and was killed"
            if r.exitCode != 0:
                return f"{self.phase} hook {r.name} exited {r.exitCode}"
        return ""

    def summary(self) -> Dict[str, Any]:
        """The `hook` object of an approval-result envelope."""
        return {
            "phase": self.phase,
            "directory": self.directory,
            "ok": self.ok,
            "hooks": [asdict(r) for r in self.results],
            "skipped": list(self.skipped),
        }


EXAMPLE_SUFFIX = ".example"
# NUL ends a C string (Popen refuses it); a surrogate in a str is always a lone one (a pair decodes to
# one character), which no UTF-8 environment can encode.
_UNSAFE = re.compile("[\x00\ud800-\udfff]")
ENV_VALUE_LIMIT = 8192  # an environment value; IMDS fields are far shorter (Description <= 4096)


def env_safe(value: Any) -> str:
    """`value` as text any environment can hold: no NUL, only encodable characters, bounded."""
    return _UNSAFE.sub("\ufffd", str(value))[:ENV_VALUE_LIMIT]


def event_environment(
    event: Mapping[str, Any], vm_name: str, vm_id: str = "", extra: Optional[Mapping[str, str]] = None
) -> Dict[str, str]:
    """The SE_* variables a hook sees for one IMDS event (fields absent in old api-versions are '')."""
    resources = event.get("Resources") or []
    if not isinstance(resources, (list, tuple)):
        resources = [resources]
    env = {
        "SE_EVENT_ID": str(event.get("EventId", "")),
        "SE_EVENT_TYPE": str(event.get("EventType", "")),
        "SE_EVENT_STATUS": str(event.get("EventStatus", "")),
        "SE_NOT_BEFORE": str(event.get("NotBefore", "")),
        "SE_DURATION_SECONDS": str(event.get("DurationInSeconds", "")),
        "SE_RESOURCES": " ".join(str(r) for r in resources),
        "SE_RESOURCE_TYPE": str(event.get("ResourceType", "")),
        "SE_EVENT_SOURCE": str(event.get("EventSource", "")),
        "SE_DESCRIPTION": str(event.get("Description", "")),
        "SE_VM_NAME": vm_name,
        "SE_VM_ID": vm_id,
    }
    env.update(extra or {})
    return {env_safe(k): env_safe(v) for k, v in env.items()}


def _allowed_owners(settings: HookSettings) -> set:
    owners = {0, *settings.extra_owner_uids}
    if hasattr(os, "geteuid"):
        owners.add(os.geteuid())
    return owners


def _refusal(path: Path, owners: set) -> Optional[str]:
    """Why `path` must not run (None: it may). Checked on the file itself, symlinks refused."""
    try:
        st = path.lstat()
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink (install the file itself)"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if os.name == "posix":
        if st.st_uid not in owners:
            return f"owned by uid {st.st_uid}, not root or the service user"
        if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
            return "group- or world-writable"
    return None


def _unsafe_directory(directory: Path, owners: set) -> Optional[str]:
    """Why the hook directory (or its parent) cannot be trusted, or None (also when it is absent)."""
    if os.name != "posix" or not directory.is_dir():
        return None
    for d in (directory, directory.parent):
        st = d.stat()
        if st.st_uid not in owners:
            return f"{d} is owned by uid {st.st_uid}, not root or the service user"
        if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
            return f"{d} is group- or world-writable"
    return None


def list_hooks(hook_dir: str, phase: str) -> List[Path]:
    """The candidate files of a phase in name order (dotfiles and editor/package leftovers skipped)."""
    directory = Path(hook_dir) / f"{phase}.d"
    if not directory.is_dir():
        return []
    names = sorted(p.name for p in directory.iterdir())
    return [
        directory / n
        for n in names
        if not n.startswith(".")
        and not n.endswith(("~", ".dpkg-old", ".dpkg-new", ".rpmnew", ".rpmsave", EXAMPLE_SUFFIX))
    ]


@dataclass
class Survey:
    """What `run_phase` would find in a phase's directory, without running anything (`check`)."""

    phase: str
    directory: str
    unsafe: Optional[str] = None                                  # the whole directory is refused
    runnable: List[str] = field(default_factory=list)
    refused: List[Tuple[str, str]] = field(default_factory=list)  # (name, why)
    skipped: List[str] = field(default_factory=list)              # not executable
    examples: List[str] = field(default_factory=list)             # *.example, never run


def survey(phase: str, settings: HookSettings) -> Survey:
    directory = Path(settings.hook_dir) / f"{phase}.d"
    found = Survey(phase, str(directory))
    owners = _allowed_owners(settings)
    try:
        found.unsafe = _unsafe_directory(directory, owners)
        if found.unsafe is not None:
            return found
        if directory.is_dir():
            found.examples = sorted(p.name for p in directory.iterdir() if p.name.endswith(EXAMPLE_SUFFIX))
        for path in list_hooks(settings.hook_dir, phase):
            if path.is_file() and not path.is_symlink() and not os.access(path, os.X_OK):
                found.skipped.append(path.name)
                continue
            reason = _refusal(path, owners)
            if reason is None:
                found.runnable.append(path.name)
            else:
                found.refused.append((path.name, reason))
    except OSError as exc:
        found.unsafe = f"cannot read {directory}: {exc.strerror or exc}"
    return found


def install_examples(hook_dir: str, windows: Optional[bool] = None) -> List[Path]:
    """Copy the packaged example hooks (forwarder/hook_examples) into `hook_dir`'s phase directories as
    `*.example` files, which are never run; an existing file is left alone. Returns what was written."""
    from importlib import resources

    windows = (os.name == "nt") if windows is None else windows
    wanted = ".cmd.example" if windows else ".sh.example"
    written: List[Path] = []
    source = resources.files(__package__).joinpath("hook_examples")
    for phase in PHASES:
        target = Path(hook_dir) / f"{phase}.d"
        for item in source.joinpath(f"{phase}.d").iterdir():
            if not item.name.endswith(wanted):
                continue
            target.mkdir(parents=True, exist_ok=True)
            path = target / item.name
            if not path.exists():
                path.write_bytes(item.read_bytes())
                if os.name == "posix":
                    os.chmod(path, 0o644)
                written.append(path)
    return written


def base_environment(windows: bool, service_env: Mapping[str, str]) -> Dict[str, str]:
    """What every hook's environment starts from, before the SE_* variables: a fixed search path and
    the system's own variables, never the service's other settings (which may hold a secret).
    Windows names are case-insensitive (os.environ upper-cases them), so they are looked up that way."""
    if not windows:
        return {"PATH": HOOK_PATH, "LANG": "C.UTF-8", "HOME": "/"}
    upper = {k.upper(): v for k, v in service_env.items()}
    env = {name: upper[name.upper()] for name in WINDOWS_PASSED if name.upper() in upper}
    root = env.setdefault("SystemRoot", "C:\\Windows")
    env.setdefault("windir", root)
    env.setdefault("SystemDrive", root[:2] if root[1:2] == ":" else "C:")
    env.setdefault("ComSpec", root + "\\system32\\cmd.exe")
    env.setdefault("PATHEXT", ".COM;.EXE;.BAT;.CMD;.VBS;.VBE;.JS;.JSE;.WSF;.WSH;.MSC")
    env["PATH"] = WINDOWS_HOOK_PATH.format(root=root)
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGKILL)  # the hook and everything it started
        else:
            proc.kill()
    except ProcessLookupError:
        pass


def run_one(path: Path, env: Mapping[str, str], settings: HookSettings) -> HookResult:
    """Run one hook with a timeout; its stdout+stderr go to a temp file (no pipe a grandchild can hold)."""
    result = HookResult(name=path.name)
    windows = os.name == "nt"
    base = base_environment(windows, os.environ)
    child_env = {**base, **env}
    cwd = base["SystemDrive"] + "\\" if windows else "/"
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                [str(path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except (OSError, ValueError) as exc:  # ValueError: an environment value Popen refuses
            result.refused = f"cannot execute: {getattr(exc, 'strerror', None) or exc}"
            return result
        try:
            result.exitCode = proc.wait(timeout=settings.timeout_seconds)
        except subprocess.TimeoutExpired:
            result.timedOut = True
            _kill_group(proc)
            result.exitCode = proc.wait()
        if not result.timedOut and hasattr(os, "killpg"):
            try:  # leftovers of a hook that exited but left children: the group is killed too
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        result.seconds = round(time.monotonic() - started, 3)
        out.seek(0)
        data = out.read(settings.output_limit + 1)
    result.outputTruncated = len(data) > settings.output_limit
    result.output = data[: settings.output_limit].decode("utf-8", errors="replace")
    return result


def run_phase(phase: str, env: Mapping[str, str], settings: HookSettings) -> HookRun:
    """Run every hook of `phase` in name order.

    pre-approve stops at the first failure (a later hook may assume the earlier drained the VM);
    post-event runs them all (clean-up steps are independent).
    """
    if phase not in PHASES:
        raise ValueError(f"unknown hook phase {phase!r}; expected one of {PHASES}")
    run = HookRun(phase=phase, directory=str(Path(settings.hook_dir) / f"{phase}.d"))
    owners = _allowed_owners(settings)
    full_env = {"SE_HOOK_PHASE": phase, **env}
    unsafe = _unsafe_directory(Path(settings.hook_dir) / f"{phase}.d", owners)
    if unsafe is not None:
        # Whoever can write the directory can swap a checked hook for their own before it runs.
        log.warning("hook directory %s refused: %s", run.directory, unsafe)
        run.results.append(HookResult(name=f"{phase}.d", refused=f"directory {unsafe}"))
        return run
    for path in list_hooks(settings.hook_dir, phase):
        if path.is_file() and not path.is_symlink() and not os.access(path, os.X_OK):
            run.skipped.append(path.name)
            log.info("hook %s skipped: not executable", path)
            continue
        reason = _refusal(path, owners)
        if reason is not None:
            log.warning("hook %s refused: %s", path, reason)
            run.results.append(HookResult(name=path.name, refused=reason))
            if phase == PRE_APPROVE:
                break
            continue
        result = run_one(path, full_env, settings)
        level = logging.INFO if result.ok else logging.WARNING
        log.log(
            level,
            "hook %s (%s, event %s): exit %s%s in %.1fs",
            path,
            phase,
            env.get("SE_EVENT_ID", ""),
            result.exitCode,
            " (timed out, killed)" if result.timedOut else "",
            result.seconds,
        )
        run.results.append(result)
        if not result.ok and phase == PRE_APPROVE:
            break
    return run
