"""Run checkov over infra/ (offline, its own venv) and judge the report: no failed check, no parsing
error (checkov silently skips a file it cannot parse, so one would go unscanned), and every skip
justified by a reason in its `checkov:skip=ID:reason` comment.

`python -m tools.checkov_gate [infra]` prints the figures and exits 1 on any problem.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
MIN_REASON = 20   # characters: a reason, not "ok"


def run(directory: Path, checkov: Path = CHECKOV, timeout: float = 300) -> Dict[str, Any]:
    env = dict(os.environ, BC_SKIP_MAPPING="TRUE", LOG_LEVEL="WARNING")
    result = subprocess.run(
        [str(checkov), "-d", str(directory), "--framework", "bicep", "--skip-download", "-o", "json"],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )
    if result.returncode not in (0, 1):
        raise RuntimeError(f"checkov exited {result.returncode}: {result.stderr[-2000:]}")
    report = json.loads(result.stdout)
    if isinstance(report, list):   # one entry per framework
        report = next((r for r in report if r.get("check_type") == "bicep"), report[0])
    return report


def summary(report: Dict[str, Any]) -> Dict[str, int]:
    s = report.get("summary", report)
    return {k: int(s.get(k, 0)) for k in ("passed", "failed", "skipped", "parsing_errors", "resource_count")}


def problems(report: Dict[str, Any], root: Optional[Path] = None) -> List[str]:
    figures = summary(report)
    found: List[str] = []
    results = report.get("results", {})
    for check in results.get("failed_checks", []):
        found.append(f"FAILED {check['check_id']} {check['resource']} {check['file_path']}:"
                     f"{check['file_line_range'][0]}: {check['check_name']}")
    if figures["failed"] and not results.get("failed_checks"):
        found.append(f"{figures['failed']} failed check(s)")
    if figures["parsing_errors"]:
        found.append(f"{figures['parsing_errors']} file(s) checkov could not parse (they went unscanned): "
                     f"{results.get('parsing_errors', [])}")
    for check in results.get("skipped_checks", []):
        reason = (check.get("check_result", {}).get("suppress_comment") or "").strip()
        if len(reason) < MIN_REASON:
            found.append(f"skip of {check['check_id']} on {check['resource']} has no real reason: {reason!r}")
    return found


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0] if args else REPO / "infra")
    if not CHECKOV.exists():
        print(f"checkov not installed at {CHECKOV}: run `make checkov-venv`", file=sys.stderr)
        return 2
    report = run(directory)
    print(json.dumps(summary(report)))
    for check in report.get("results", {}).get("skipped_checks", []):
        reason = check["check_result"].get("suppress_comment")
        print(f"skipped {check['check_id']} {check['resource']}: {reason}")
    issues = problems(report)
    for issue in issues:
        print(issue)
    return 1 if issues else 0


if __name__ == "__main__":
    raise SystemExit(main())
