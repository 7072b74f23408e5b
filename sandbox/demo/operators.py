"""The demo's signed-in operators (docs/security.md, "Operators"): after the scenes, a long Freeze of vm-a
that the scenario's policy holds for an operator (rule long-freeze-needs-an-operator).

  Rita, signed in with the Reader role, tries to approve it    -> 403, nothing recorded
  Olga, signed in with the Operator role, approves it          -> recorded under her token's name and
                                                                  object id; vm-a approves it at IMDS

The runner emulates App Service authentication (sandbox/functions/easyauth.py) with tokens from the local
test issuer; every other call of the demo is signed in as Olga too (Fleet.call).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

from central.store.tables import get_json
from sandbox.demo.fleet import OPERATORS, Fleet
from sandbox.demo.scenario import Check, table_rows

EVENT = {"eventType": "Freeze", "eventSource": "Platform", "resources": ["vm-a"], "durationInSeconds": 120,
         "startedSeconds": 5.0}
WAIT_SECONDS = 30.0


def _wait(condition: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    return None


def _pending_hold(fleet: Fleet, event_id: str) -> Optional[Dict[str, Any]]:
    pending = fleet.call("events/pending", "Operator")
    if pending.status_code != 200:
        return None
    return next((e for e in pending.json() if e["eventId"] == event_id
                 and (e.get("decision") or {}).get("action") == "hold"), None)


def play(fleet: Fleet, say: Callable[[str], None] = print) -> List[Check]:
    """Run the two decisions and return their checks (scene "op")."""
    assert fleet.imds is not None
    checks: List[Check] = []

    def add(what: str, ok: bool, detail: str = "") -> None:
        checks.append(Check("op", what, bool(ok), "" if ok else detail))

    event_id = fleet.imds.add_event(**EVENT)["eventId"]
    say(f"         scene op: a 2-minute Freeze of vm-a (EventId {event_id[:8]}), held for an operator")
    held = _wait(lambda: _pending_hold(fleet, event_id), WAIT_SECONDS)
    add("central holds it for an operator (policy long-freeze-needs-an-operator)", held is not None,
        "not pending with a hold in time")
    reader_name, _ = OPERATORS["Reader"]
    refused = fleet.call(f"events/{event_id}/approve", "Reader", {"reason": "looks fine to me"})
    say(f"         {reader_name} (Reader) approves: {refused.status_code} "
        f"{refused.json().get('error', '') if refused.status_code != 200 else ''}")
    add("a signed-in Reader's approve is refused (403)", refused.status_code == 403,
        f"answered {refused.status_code}")
    name, oid = OPERATORS["Operator"]
    approved = fleet.call(f"events/{event_id}/approve", "Operator",
                          {"reason": "app team agreed: freeze now", "operator": "someone-else"})
    say(f"         {name} (Operator) approves: {approved.status_code}")
    add("a signed-in Operator's approve is accepted (200)", approved.status_code == 200,
        f"answered {approved.status_code}: {approved.text[:200]}")
    who = f"operator:{name} ({oid})"
    imds = fleet.imds
    started = _wait(lambda: imds.event(event_id).get("approvedBy"), WAIT_SECONDS)
    add("vm-a approved it at IMDS", started == ["vm-a"], f"approvedBy {started}")
    rows = table_rows(fleet.storage, ["Decisions", "Events"])
    decisions = [r for r in rows["Decisions"] if r.get("EventId") == event_id]
    by_hand = [r.get("DecidedBy") for r in decisions if r.get("Rule") == "operator"]
    say(f"         recorded: {by_hand}")
    add(f"the decision names the token's person: {who}", by_hand == [who], f"operator decisions {by_hand}")
    row = next((r for r in rows["Events"] if r.get("EventId") == event_id), {})
    sent = [(a.get("vmName"), a.get("decidedBy")) for a in get_json(row, "Approvals", [])] if row else []
    add("the approval message to vm-a carries it too", sent == [("vm-a", who)], f"Approvals {sent}")
    add("the Reader and the body's 'operator' decided nothing",
        not any("rita" in str(r.get("DecidedBy")) or "someone-else" in str(r.get("DecidedBy"))
                for r in decisions), f"DecidedBy {[r.get('DecidedBy') for r in decisions]}")
    return checks
