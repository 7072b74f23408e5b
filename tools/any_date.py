"""The suite on any date (issue 45): run the in-process suites with the clock moved by Debian's `faketime`
(400 days ahead and 30 days behind by default), one pytest per shift, the shifts side by side.

A test that builds data at a fixed date and lets the code under test read the real clock passes until the
calendar moves past some window; moving the clock finds it today. Each pytest runs serially (pytest-xdist's
workers hang under libfaketime) with pytest-timeout, so a hang is a failure with a traceback, not a stuck CI.

    python -m tools.any_date [--shift +400d] [--shift -30d] [SUITE ...]

Exit 0 when every shift passed; 1 when one failed (its summary is printed); 2 when faketime is missing or a
run collected no test (pytest's exit 5 is a failure here, never a pass).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parent.parent
SUITES = ("tests/central", "tests/forwarder", "tests/forwarder_approvals", "tests/schemas", "tests/security",
          "tests/test_repository.py")
SHIFTS = ("+400d", "-30d")
TIMEOUT_PER_TEST = 300
NO_TESTS = 5  # pytest's exit code when nothing was collected


def command(shift: str, suites: Sequence[str]) -> List[str]:
    return ["faketime", "-f", shift, sys.executable, "-m", "pytest", *suites, "-m", "not slow", "-q",
            "-p", "no:cacheprovider", "-p", "no:xdist", f"--timeout={TIMEOUT_PER_TEST}"]


def run(shifts: Sequence[str], suites: Sequence[str], log_dir: Path) -> List[Tuple[str, int, float, str]]:
    """Start one pytest per shift, wait for all; (shift, exit code, seconds, last lines) each."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    procs = []
    for shift in shifts:
        log = log_dir / f"any-date{shift}.log"
        with log.open("w") as out:
            procs.append((shift, log, subprocess.Popen(command(shift, suites), cwd=REPO, stdout=out,
                                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
    results = []
    for shift, log, proc in procs:
        code = proc.wait()
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        results.append((shift, code, time.monotonic() - started, "\n".join(tail)))
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.any_date", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shift", action="append", help="faketime offset, e.g. +400d (repeatable)")
    parser.add_argument("--logs", type=Path, default=REPO / ".any-date", help="where each run's log goes")
    parser.add_argument("suites", nargs="*", default=list(SUITES))
    args = parser.parse_args(argv)
    if shutil.which("faketime") is None:
        print("any-date: faketime is missing: apt-get install -y faketime (Debian's libfaketime)",
              file=sys.stderr)
        return 2
    worst = 0
    for shift, code, seconds, tail in run(args.shift or list(SHIFTS), args.suites, args.logs):
        verdict = "passed" if code == 0 else "NO TESTS" if code == NO_TESTS else f"FAILED (exit {code})"
        print(f"any-date: clock {shift}: {verdict} after {seconds:.0f} s ({args.logs}/any-date{shift}.log)")
        if code != 0:
            print(tail)
            worst = max(worst, 2 if code == NO_TESTS else 1)
    return worst


if __name__ == "__main__":
    sys.exit(main())
