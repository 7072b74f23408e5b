"""`se-fleet status`: the fleet at a glance, from central's GET /api/fleet (any instance answers the same).
`se-fleet reverify`: after a trust repair, re-verify now the envelopes kept for a trust failure (POST
/api/authn/reverify, the Operator role; docs/security.md, "When Azure changes its CA").

    se-fleet status [--url https://<app>.azurewebsites.net] [--api api://<client id>] [--token TOKEN]
                    [--silent-only] [--json]
    se-fleet reverify [--url ...] [--api ...] [--token ...] [--json]

Signed in as the operator (the Reader or Operator app role; docs/security.md): with --api (default
$SE_OPERATOR_API, the operator API's app id URI) the token comes from the operator's own login through
azure-identity (az login, environment, managed identity...); --token (default $SE_OPERATOR_TOKEN) sends a
token got elsewhere, e.g. `az account get-access-token --resource api://<client id> --query accessToken
-o tsv`. --url defaults to $SE_CENTRAL_URL. Exit codes: 0 every VM live (reverify: nothing left held), 1 some
VM silent (reverify: envelopes still held for trust), 3 bad usage, 4 central unreachable or refusing, 5 no
token (sign in). pending, show, approve, hold, release: se_fleet_events.py (6 no such event, 7 refused).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any, Dict, List, NoReturn, Optional, Sequence, TextIO

from central.cli import coverage_command, se_fleet_events
from central.cli.closed_pipe import survives_closed_pipe
from central.policy import coverage

EXIT_OK, EXIT_SILENT, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NO_TOKEN = 0, 1, 3, 4, 5


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


class NoToken(Exception):
    pass


def operator_token(api: str) -> str:
    """An access token for the operator API from the operator's own login (azure-identity's chain: az
    login, environment, managed identity, ...; never a browser prompt from a script)."""
    try:
        from azure.core.exceptions import ClientAuthenticationError
        from azure.identity import DefaultAzureCredential
    except ImportError:  # pragma: no cover - ops/pyproject.toml installs it
        raise NoToken("azure-identity is not installed: pip install ./ops, or pass --token") from None
    try:
        return DefaultAzureCredential(exclude_interactive_browser_credential=True).get_token(
            api.rstrip("/") + "/.default").token
    except ClientAuthenticationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise NoToken(f"no token for {api}: sign in (az login) first ({first})") from None


def fetch(url: str, token: str, timeout: float = 30.0, route: str = "fleet",
          method: str = "GET") -> Dict[str, Any]:
    """GET <url>/api/fleet (or another route) as the signed-in operator (the operator's own proxy settings
    apply)."""
    if not url.startswith(("https://", "http://")):
        raise UsageError(f"--url {url!r}: give the Function app's https:// URL")
    request = urllib.request.Request(url.rstrip("/") + "/api/" + route, method=method,  # noqa: S310
                                     data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - scheme checked above
        return json.loads(response.read())


def render(fleet: Dict[str, Any], silent_only: bool = False) -> str:
    rows = [("VM", "GROUPS", "LAST HEARD", "BACKLOG", "DROPPED", "VERSION", "OPEN EVENTS", "STATE")]
    for vm in fleet["vms"]:
        if silent_only and not vm["silent"]:
            continue
        events = vm["openEvents"]
        states = vm.get("openEventStates") or {}
        rows.append((vm["name"], ",".join(g.split(":", 1)[-1] for g in vm["groups"]) or "-",
                     vm.get("lastSeen") or "never", str(vm["outboxBacklog"]), str(vm["outboxDropped"]),
                     vm.get("forwarderVersion") or "-",
                     ",".join(e[:8] + (f"({states[e]})" if e in states else "")
                              for e in events[:3]) + (f" +{len(events) - 3}" if len(events) > 3 else "")
                     or "-", "SILENT" if vm["silent"] else "live"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.append(f"\n{fleet['knownVms']} VM(s): {fleet['liveVms']} live, {fleet['silentVms']} silent "
                 f"(nothing received for {fleet['livenessSeconds']:g} s) at {fleet['at']}")
    mode = fleet.get("authnMode", "required")
    if mode == "off":
        lines.append("WARNING: sender authentication is OFF (AUTHN_MODE=off): any holder of the hub's send "
                     "right can speak for any VM (docs/security.md)")
    elif mode != "required":
        lines.append(f"sender authentication: {mode} (unsigned envelopes accepted from VMs never seen "
                     "signed)")
    lines.extend(coverage_lines(fleet.get("coverage")))
    held = fleet.get("heldForTrust") or {}
    if held.get("count"):
        lines.append(held_line(held))
    gone = held.get("givenUp") or {}
    if gone.get("count"):
        vms = ", ".join(f"{v['vm']} ({v['count']})" for v in gone.get("vms") or [])
        lines.append(f"WARNING: {gone['count']} envelope(s) held for trust were given up unverified after "
                     f"{held.get('keptDays')} days (AUTHN_HELD_DAYS), last at {gone.get('last')}: {vms}")
    return "\n".join(lines)


def coverage_lines(section: Optional[Dict[str, Any]]) -> List[str]:
    """The fleet view's coverage (central's own Resource Graph read), counted as `se-fleet coverage`."""
    if not section:  # an older central
        return []
    if not section.get("configured"):
        return [f"coverage: not configured ({section.get('note', '')})"]
    scopes = ", ".join(section.get("scopes") or [])
    lines = [f"coverage of {scopes}, read at {section.get('readAt') or 'never'} "
             f"(every {section.get('refreshSeconds', 0):g} s):"]
    if section.get("error"):
        lines.append(f"WARNING: coverage read failed: {section['error']}")
    if section.get("readAt"):
        lines.extend("  " + line for line in coverage.summary_lines(section))
        blind = section.get("blind") or []
        if blind:
            more = section["byVerdict"]["blind"] - len(blind)
            names = ", ".join(b.rsplit("/", 1)[-1] for b in blind) + (f" +{more}" if more else "")
            lines.append(f"BLIND: {names} (se-fleet coverage --blind-only lists them)")
    if not section.get("agentlessRead"):
        lines.append("note: COVERAGE_PRINCIPAL_ID is empty: no VM counts as agentless")
    return lines


def held_line(held: Dict[str, Any]) -> str:
    return (f"WARNING: {held['count']} envelope(s) held for trust since {held.get('oldest')} (issuers: "
            f"{', '.join(held.get('issuers') or []) or '?'}): repair trust, then `se-fleet reverify` "
            "(docs/security.md, 'When Azure changes its CA')")


def render_reverify(answer: Dict[str, Any]) -> str:
    outcomes = answer.get("outcomes") or {}
    done = ", ".join(f"{k} {v}" for k, v in outcomes.items() if v) or "nothing was held"
    held = answer.get("heldForTrust") or {}
    tail = held_line(held) if held.get("count") else "nothing is held for trust any more"
    return f"re-verified at {answer.get('at')}: {done}\n{tail}"


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="se-fleet", description="The scheduled-events fleet as central sees it.")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    status = sub.add_parser("status", help="every VM: last heard, outbox, version, open events, silent")
    again = sub.add_parser("reverify", help="re-verify the envelopes kept for a trust failure now (Operator)")
    coverage = coverage_command.register(sub)
    for one in (status, again, coverage, *se_fleet_events.register(sub)):
        one.add_argument("--url", default=os.environ.get("SE_CENTRAL_URL", ""),
                         help="the Function app's URL (default $SE_CENTRAL_URL)")
        one.add_argument("--api", default=os.environ.get("SE_OPERATOR_API", ""),
                         help="the operator API's app id URI, api://<client id> (default $SE_OPERATOR_API)")
        one.add_argument("--token", default=os.environ.get("SE_OPERATOR_TOKEN", ""),
                         help="an access token for the operator API (default $SE_OPERATOR_TOKEN)")
        one.add_argument("--json", action="store_true", help="the answer as JSON")
    status.add_argument("--silent-only", action="store_true", help="list only silent VMs")
    return top


@survives_closed_pipe
def main(argv: Optional[Sequence[str]] = None, out: Optional[TextIO] = None) -> int:
    out = out or sys.stdout
    try:
        args = parser().parse_args(argv)
        if args.command == "coverage":
            return coverage_command.run(args, out, fetch, operator_token, NoToken)
        if not args.url or not (args.api or args.token):
            raise UsageError("give --url and --api or --token (or set SE_CENTRAL_URL and SE_OPERATOR_API)")
        token = args.token or operator_token(args.api)
        if args.command in se_fleet_events.COMMANDS:  # pending, show, approve, hold, release
            return se_fleet_events.run(args, token, out, sys.stderr)
        if args.command == "reverify":
            answer = fetch(args.url, token, 120.0, "authn/reverify", "POST")
            print(json.dumps(answer, indent=2) if args.json else render_reverify(answer), file=out)
            return EXIT_SILENT if (answer.get("heldForTrust") or {}).get("count") else EXIT_OK
        fleet = fetch(args.url, token)
    except UsageError as exc:
        print(f"se-fleet: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NoToken as exc:
        print(f"se-fleet: {exc}", file=sys.stderr)
        return EXIT_NO_TOKEN
    except urllib.error.HTTPError as exc:
        hint = {401: ": sign in again (the token is missing, expired or for another API)",
                403: ": your account lacks the " + ("Operator app role" if args.command == "reverify"
                                                     else "Reader or Operator app role")}.get(exc.code, "")
        print(f"se-fleet: central answered {exc.code} {exc.reason}{hint}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"se-fleet: central at {args.url} is not reachable: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.json:
        json.dump(fleet, out, indent=2)
        print(file=out)
    else:
        print(render(fleet, args.silent_only), file=out)
    return EXIT_SILENT if fleet.get("silentVms") else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
