"""`se-fleet pending | show | approve | hold | release`: the on-call console's reads and decisions from a
terminal, through the same operator API and the same sign-in as `se-fleet status` (se_fleet.py registers
these verbs and hands over the token).

    se-fleet pending [--json]                  the open events, oldest first (GET /api/events/pending)
    se-fleet show EVENT [--json]               one event's story (GET /api/events/{id})
    se-fleet approve EVENT --reason TEXT [--hook | --arm]
    se-fleet hold EVENT --reason TEXT
    se-fleet release EVENT --reason TEXT       (POST /api/events/{id}/{action}, the Operator role)

Exit codes (as for status: 3 bad usage, 4 central unreachable or refusing the sign-in, 5 no token):
0 done (pending: the list printed, whatever its length), 6 no such event, 7 central refused the decision
(the event has ended, is not held, NotBefore has passed...; its message says which).
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, TextIO

COMMANDS = ("pending", "show", "approve", "hold", "release")
EXIT_OK, EXIT_UNREACHABLE, EXIT_UNKNOWN, EXIT_REFUSED = 0, 4, 6, 7


def register(sub: Any) -> List[argparse.ArgumentParser]:
    """The verbs' parsers (se_fleet.py adds --url/--api/--token/--json to each)."""
    made = [sub.add_parser("pending", help="the open events, oldest first: state, NotBefore, why")]
    show = sub.add_parser("show", help="one event's story: reports, decisions, approvals, alerts")
    show.add_argument("event", help="the EventId (any case)")
    made.append(show)
    for action, text in (("approve", "approve an event now (the Operator role)"),
                         ("hold", "hold an event: no automatic approval until released (Operator)"),
                         ("release", "release a hold: the policy decides again now (Operator)")):
        one = sub.add_parser(action, help=text)
        one.add_argument("event", help="the EventId (any case)")
        one.add_argument("--reason", required=True, help="why (recorded with your name; required)")
        if action == "approve":
            how = one.add_mutually_exclusive_group()
            how.add_argument("--hook", action="store_true", help="the VM runs its pre-approval hook first")
            how.add_argument("--arm", action="store_true", help="approve through ARM, no VM involved")
        made.append(one)
    return made


def call(url: str, token: str, route: str, body: Optional[Dict[str, Any]] = None,
         timeout: float = 60.0) -> Any:
    """GET (or POST `body` to) <url>/api/<route> as the signed-in operator."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", **({"Content-Type": "application/json"} if data else {})}
    request = urllib.request.Request(url.rstrip("/") + "/api/" + route, data=data,  # noqa: S310
                                     method="POST" if data else "GET", headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - se_fleet checks the scheme
        return json.loads(response.read())


def left(not_before: Optional[str], now: datetime) -> str:
    if not not_before:
        return "no NotBefore"
    seconds = int((datetime.fromisoformat(not_before.replace("Z", "+00:00")) - now).total_seconds())
    return f"in {seconds // 60} min {seconds % 60} s" if seconds >= 0 else f"passed {-seconds} s ago"


def why(event: Dict[str, Any]) -> str:
    decision = event.get("decision") or {}
    rule = f"rule {decision['rule']}: " if decision.get("rule") else ""
    return (rule + str(decision.get("reason") or decision.get("action") or "")) or "no decision yet"


def render_pending(events: List[Dict[str, Any]], now: datetime) -> str:
    if not events:
        return "nothing is pending"
    lines = []
    for e in events:
        held = ", held by an operator" if e.get("operatorHold") else ""
        lines += [f"{e['eventId']}  {e['eventType']} on {', '.join(e['resources'])}",
                  f"  {e['state']} ({e['status']}{held}); NotBefore {e.get('notBefore') or '-'} "
                  f"({left(e.get('notBefore'), now)})", f"  why: {why(e)}"]
    return "\n".join(lines)


def render_event(e: Dict[str, Any], now: datetime) -> str:
    lines = [f"{e['eventId']}  {e['eventType']} on {', '.join(e['resources'])}",
             f"state: {e['state']} ({e['status']}); NotBefore {e.get('notBefore') or '-'} "
             f"({left(e.get('notBefore'), now)})", f"why: {why(e)}",
             "reported by: " + (", ".join(sorted(e.get("reportedBy") or {})) or "-")
             + (" and Azure's own feed" if (e.get("witnesses") or {}).get("platform") else ""), "decisions:"]
    lines += [f"  {d.get('at')}  {d.get('action')} -> {d.get('state')} by {d.get('decidedBy')}"
              f"{' (shadow)' if d.get('shadow') else ''}: {d.get('reason') or ''}"
              for d in e.get("decisions") or []]
    lines.append("approvals:")
    lines += [f"  #{a.get('attempt')} {a.get('action')} to {a.get('vmName') or a.get('via')} sent "
              f"{a.get('sentAt')}: result {a.get('result') or 'none yet'}" for a in e.get("approvals") or []]
    lines.append("alerts:")
    lines += [f"  {a.get('at')}  [{a.get('severity')}] {a.get('title')} ({a.get('outcome') or '?'})"
              for a in e.get("alerts") or []]
    return "\n".join(lines)


def run(args: argparse.Namespace, token: str, out: TextIO, err: TextIO,
        now: Optional[datetime] = None) -> int:
    """One verb; HTTP refusals become an exit code and central's own message on `err`."""
    now = now or datetime.now(timezone.utc)
    try:
        if args.command == "pending":
            answer = call(args.url, token, "events/pending")
            text = render_pending(answer, now)
        elif args.command == "show":
            answer = call(args.url, token, f"events/{urllib.request.quote(args.event, safe='')}")
            text = render_event(answer, now)
        else:
            body: Dict[str, Any] = {"reason": args.reason}
            if getattr(args, "hook", False):
                body["hook"] = True
            if getattr(args, "arm", False):
                body["via"] = "arm"
            route = f"events/{urllib.request.quote(args.event, safe='')}/{args.command}"
            answer = call(args.url, token, route, body)
            decided = (answer.get("decision") or {}).get("decidedBy") or "you"
            text = f"{args.command}: {answer['eventId']} is now {answer['state']} (recorded as {decided})"
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error") or exc.reason
        except ValueError:
            message = exc.reason
        print(f"se-fleet: central answered {exc.code}: {message}", file=err)
        return {404: EXIT_UNKNOWN, 409: EXIT_REFUSED, 400: EXIT_REFUSED}.get(exc.code, EXIT_UNREACHABLE)
    print(json.dumps(answer, indent=2) if args.json else text, file=out)
    return EXIT_OK
