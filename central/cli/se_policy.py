"""`se-policy`: the operator's policy tool, offline on a file.

    se-policy check FILE [--json] [--strict]
    se-policy explain FILE --event '{...}' [--vm '{...}' ...] [--now ISO] [--json]
    se-policy whatif FILE (--since 30d [--connection-string CS | --table-endpoint URL] | --from FILE.jsonl)
    se-policy whatif FILE --from-resource-graph --since 30d [--subscription ID ...]

FILE is a POLICY_JSON document ("-" reads stdin); --event and --vm take JSON or @file.
Exit codes: 0 valid (warnings are printed), 1 only warnings and --strict, 2 the policy is invalid,
3 bad usage or unreadable input (file missing, --event not JSON), 4 whatif's history unreadable (log
store unreachable, a line not an envelope), 5 whatif --from-resource-graph without an Azure login, or the
login or a --subscription refused. Never a traceback for bad input.
The only place of this tool that reads argv; everything it prints comes from pure functions.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any, Dict, List, NoReturn, Optional, Sequence, TextIO

from central.cli import whatif_command as whatif_cli
from central.model.times import aware, iso, utcnow
from central.policy import document as policy_mod
from central.policy.lint import lint
from central.policy.validation import Finding, document_errors, path_key

from .closed_pipe import survives_closed_pipe
from .explain import Explanation, event_from_json, explain, vm_from_json

EXIT_OK, EXIT_WARNINGS, EXIT_INVALID, EXIT_USAGE = 0, 1, 2, 3


class UsageError(Exception):
    """Bad arguments or unreadable input: one line, exit 3."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own exit code 2 would read as "invalid"
        raise UsageError(message)


def _read(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def _json_arg(flag: str, value: str) -> Any:
    text = _read(value[1:]) if value.startswith("@") else value
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag} is not JSON ({exc}); give a JSON object or @file") from None


def check_text(text: str) -> List[Finding]:
    """Every finding for a POLICY_JSON text: errors (schema, semantic, lint) and warnings."""
    if not text.strip():
        return []  # empty POLICY_JSON: the built-in defaults
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return [Finding("/", f"not JSON: {exc}", "check quotes, commas and brackets there", code="json")]
    findings = document_errors(doc)
    if not findings:
        findings = lint(policy_mod.load(text))
    return sorted(findings, key=lambda f: (f.severity != "error", path_key(f)))


def _print_findings(findings: Sequence[Finding], out: TextIO) -> None:
    for f in findings:
        print(f"{f.severity:<8}{f.path}: {f.message}", file=out)
        if f.hint:
            print(f"{'':<8}hint: {f.hint}", file=out)


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    findings = check_text(_read(args.file))
    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity != "error"]
    code = EXIT_INVALID if errors else EXIT_WARNINGS if warnings and args.strict else EXIT_OK
    if args.json:
        json.dump({"file": args.file, "valid": not errors, "errors": [f.to_json() for f in errors],
                   "warnings": [f.to_json() for f in warnings], "exitCode": code}, out, indent=2)
        print(file=out)
        return code
    verdict = "invalid" if errors else "valid"
    print(f"{args.file}: {verdict}: {len(errors)} error(s), {len(warnings)} warning(s)", file=out)
    _print_findings(findings, out)
    return code


def _load_for_explain(path: str, out: TextIO, as_json: bool) -> Optional[policy_mod.Policy]:
    text = _read(path)
    findings = [f for f in check_text(text) if f.severity == "error" and f.code != "shadowed-rule"]
    if not findings:
        return policy_mod.load(text)
    if as_json:
        json.dump({"file": path, "valid": False, "errors": [f.to_json() for f in findings]}, out, indent=2)
        print(file=out)
    else:
        print(f"{path}: invalid (central would hold every event): run se-policy check {path}", file=out)
        _print_findings(findings, out)
    return None


def _now(value: Optional[str]) -> datetime:
    if not value:
        return utcnow()
    try:
        return aware(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        raise UsageError(f"--now {value!r} is not ISO 8601 (2026-11-21T03:00:00Z)") from None


def _miss_text(miss: Dict[str, Any]) -> str:
    who = f"{miss['vm']} has" if "vm" in miss else "got"
    return f"{miss['key']} wants {json.dumps(miss['wanted'])}, {who} {json.dumps(miss['got'])}"


def render_explanation(result: Explanation, out: TextIO) -> None:
    data = result.to_json()
    ev = data["event"]
    print(f"event {ev['EventId'] or '(no EventId)'}: {ev['EventType']} from {ev['EventSource']}, "
          f"DurationInSeconds {ev['DurationInSeconds']}, "
          f"NotBefore {ev['NotBefore'] or '(none)'}, at {data['now']}", file=out)
    unknown = ", ".join(data["unknownResources"])
    print(f"VMs central knows: {', '.join(data['vms']) or 'none'}"
          + (f"; not known (no --vm): {unknown}" if unknown else ""), file=out)
    for t in data["rules"]:
        label = f"  #{t['index']:<3}{t['rule']} ({t['origin']})"
        if t["fits"]:
            print(f"{label}: fits", file=out)
        else:
            print(f"{label}: no: " + "; ".join(_miss_text(m) for m in t["misses"]), file=out)
    print(f"decided by {data['decidedBy']}: {data['action']} (severity {data['severity']})", file=out)
    for b in data["budgets"]:
        print(f"  budget {b['budget']}: group {b['group']}, {b['groupSize']} known VM(s), limit {b['limit']}",
              file=out)
    win = data["window"]
    if win:  # the window's own hours in its zone, and when it next opens there and in UTC
        local = f" = {win['nextOpenLocal']}" if win.get("nextOpenLocal") else ""
        print(f"window {win['window']}: {win['localHours']} {win['timeZone']}; "
              f"{'open now' if win['openNow'] else 'next opens ' + str(win['nextOpen'] or 'never') + local}",
              file=out)
    print(f"outcome: {data['outcome']}: {data['reason']}", file=out)


def cmd_explain(args: argparse.Namespace, out: TextIO) -> int:
    policy = _load_for_explain(args.file, out, args.json)
    if policy is None:
        return EXIT_INVALID
    try:
        vms = [vm_from_json(_json_arg("--vm", v)) for v in args.vm or []]
        event = event_from_json(_json_arg("--event", args.event), [vm.name for vm in vms])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = explain(policy, event, vms, _now(args.now))
    if args.json:
        json.dump(result.to_json(), out, indent=2)
        print(file=out)
    else:
        render_explanation(result, out)
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="se-policy", description="Check, explain and rehearse a central policy (POLICY_JSON).")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    check = sub.add_parser("check", help="every error and warning in a policy file, with paths and hints")
    check.add_argument("file", help='the POLICY_JSON document ("-": stdin)')
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument("--strict", action="store_true", help="exit 1 when there are warnings")
    exp = sub.add_parser("explain", help="which rule decides an event, and why earlier rules did not")
    exp.add_argument("file", help='the POLICY_JSON document ("-": stdin)')
    exp.add_argument("--event", required=True,
                     help="an IMDS event as JSON (or @file): EventType, NotBefore, Resources, ...")
    exp.add_argument("--vm", action="append",
                     help="a VM of Resources as the envelope's data.vm (JSON or @file); repeat for several")
    exp.add_argument("--now", help=f"decide as of this ISO 8601 time (default: now, e.g. {iso(utcnow())})")
    exp.add_argument("--json", action="store_true", help="the structured trace as JSON")
    whatif_cli.add_parser(sub)
    return top


def cmd_whatif(args: argparse.Namespace, out: TextIO) -> int:
    policy = _load_for_explain(args.file, out, args.json)
    if policy is None:
        return EXIT_INVALID
    try:
        return whatif_cli.run(args, policy, _now(args.now), out)
    except whatif_cli.UsageError as exc:
        raise UsageError(str(exc)) from None


@survives_closed_pipe
def main(argv: Optional[Sequence[str]] = None, out: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    try:
        args = parser().parse_args(argv)
        commands = {"check": cmd_check, "explain": cmd_explain, "whatif": cmd_whatif}
        return commands[args.command](args, out)
    except UsageError as exc:
        print(f"se-policy: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
