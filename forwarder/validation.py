"""Schema checks on the VM, and where they run (docs/forwarder.md, "Footprint").

What comes in is always checked against `schemas/`: each new IMDS document (an invalid one is
quarantined), the document read again before an approval POST, and each approval message. The daemon
runs those checks in a short-lived child process (`python -m forwarder.validation SCHEMA LIMIT`, the
instance on stdin, its errors on stdout), so jsonschema and its six helpers are never imported into the
process that idles on the VM for months (bench.forwarder_footprint). A child costs 0.3 s of CPU and 26 MiB
for that moment (/usr/bin/time, VM venv, 3 runs: 0.29-0.39 s, 26.1 MiB peak), paid when a new document or
message arrives: a few times per maintenance event.

What the forwarder builds itself (its envelopes) is checked in-process by every other entry point and
by the tests, not by the daemon: central validates every envelope it receives and quarantines (and
alerts on) one that fails, and a check in the daemon would keep jsonschema loaded for the heartbeat it
builds every minute.

`run` calls `use_child_process()`; `check`, `approve`, the tests and central's tools keep the default
(in-process).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, List

CHILD_TIMEOUT = 60.0  # seconds; a child takes ~0.3 s of CPU, the rest is a loaded VM's (or Wine's) slack
OUTPUT_LIMIT = 1 << 20  # bytes of errors read back (20 errors of 300 characters at most, as JSON)
Errors = List[Dict[str, str]]

_in_child = False


class ValidationUnavailable(RuntimeError):
    """The child process could not say whether the instance is valid (could not start, died, timed out or
    answered nonsense): nothing is decided on it, the caller tries again later."""


def use_child_process(enabled: bool = True) -> None:
    """Run the checks of what comes in in a child process from now on (the daemon's setting)."""
    global _in_child
    _in_child = enabled


def checks_own_output() -> bool:
    """Whether envelopes this process builds are checked against the schema before they are used."""
    return not _in_child


def errors(schema: str, instance: Any, limit: int = 20) -> Errors:
    """Every reason `instance` fails schema file `schema`, as schemas.errors gives them (empty: valid).
    In the daemon, in a child process; raises ValidationUnavailable when that child gives no answer."""
    if not _in_child:
        return _errors_here(schema, instance, limit)
    return _errors_in_child(schema, instance, limit)


def _errors_here(schema: str, instance: Any, limit: int) -> Errors:
    import schemas

    return schemas.errors(schema, instance, limit)


def _errors_in_child(schema: str, instance: Any, limit: int) -> Errors:
    data = json.dumps(instance, ensure_ascii=False).encode("utf-8")
    flags = getattr(subprocess, "CREATE_NO_WINDOW", 0)  # Windows: no console window for the child
    try:
        done = subprocess.run(
            [sys.executable, "-m", "forwarder.validation", schema, str(limit)],
            input=data, capture_output=True, timeout=CHILD_TIMEOUT, creationflags=flags, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValidationUnavailable(f"schema check of {schema} could not run: {exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise ValidationUnavailable(
            f"schema check of {schema} failed (exit {done.returncode}): {tail[0][:300]}")
    try:
        found = json.loads(done.stdout[:OUTPUT_LIMIT])
    except ValueError as exc:
        raise ValidationUnavailable(f"schema check of {schema} answered no JSON: {exc}") from exc
    if not isinstance(found, list) or not all(
            isinstance(e, dict) and isinstance(e.get("path"), str) and isinstance(e.get("message"), str)
            for e in found):
        raise ValidationUnavailable(f"schema check of {schema} answered something else than errors")
    return found


def _main(argv: List[str]) -> int:
    """The child: `SCHEMA LIMIT`, the instance as JSON on stdin -> its errors as JSON on stdout."""
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m forwarder.validation SCHEMA LIMIT < instance.json", file=sys.stderr)
        return 2
    try:
        instance = json.loads(sys.stdin.buffer.read().decode("utf-8"))
        found = _errors_here(argv[0], instance, int(argv[1]))
    except RecursionError:  # a deeply nested value's error message; the parent's callers say so
        found = [{"path": "/", "message": "nested too deep to check"}]
    except Exception as exc:  # noqa: BLE001 - one line to the parent, never a traceback
        print(f"{type(exc).__name__}: {exc}"[:300], file=sys.stderr)
        return 1
    sys.stdout.buffer.write(json.dumps(found).encode("ascii"))  # ASCII: no console code page in the way
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
