"""The timeline a person reads: one line per step, relative time, who, what; from the evidence only.

    +  3.2s  vm-a     forwarder  incarnation 2: [a] Reboot Scheduled  (central got it +0.3s)
    +  3.6s  central  decision   [a] Reboot: approve (rule default:user-initiated) -> leader vm-a
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, List, Optional

from central.store.tables import get_json
from sandbox.demo.scenario import Evidence, Scene, posted_ids


@dataclass(frozen=True)
class Line:
    t: float       # unix time
    who: str       # vm name, "imds", "central", "webhook"
    kind: str      # a short tag: imds, forwarder, decision, approval, result, alert, hook, POST
    text: str


def _epoch(value: Any) -> Optional[float]:
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def build(plan: List[Scene], ev: Evidence) -> List[Line]:
    labels = {s.event_id: s.label for s in plan if s.event_id}

    def name(event_id: str) -> str:
        return labels.get(event_id, event_id[:8])

    lines: List[Line] = []

    def add(t: Any, who: str, kind: str, text: str) -> None:
        moment = _epoch(t)
        if moment is not None:
            lines.append(Line(moment, who, kind, text))

    for scene in plan:
        sim = ev.sim_events.get(scene.event_id)
        if not sim:
            continue
        add(sim.get("createdAt"), "imds", "imds", f"{scene.label} {sim['eventSource']} Scheduled for "
            f"{', '.join(sim['resources'])} (NotBefore {scene.created.get('notBefore', '?')})")
        add(sim.get("startedAt"), "imds", "imds", f"{scene.label} Started (approved by "
            f"{', '.join(sim.get('approvedBy') or []) or 'nobody: NotBefore passed'})")
        add(sim.get("goneAt"), "imds", "imds", f"{scene.label} gone ({sim['state']})")

    for row in sorted(ev.tables["Incarnations"], key=lambda r: (_epoch(r.get("ObservedAt")) or 0)):
        doc = get_json(row, "Document", {}) or {}
        listed = [f"{name(e.get('EventId', ''))} {e.get('EventStatus')}" for e in doc.get("Events", [])]
        if row.get("Incarnation") == 1 and not listed:
            continue  # every forwarder's first, empty document: not part of the story
        delay = (_epoch(row.get("ReceivedAt")) or 0) - (_epoch(row.get("ObservedAt")) or 0)
        add(row.get("ObservedAt"), row.get("VmName", "?"), "forwarder",
            f"incarnation {row.get('Incarnation')}: {'; '.join(listed) or 'no events'}  "
            f"(published; central had it {delay:+.1f}s later)")

    for row in ev.tables["Decisions"]:
        event = name(row.get("EventId", ""))
        if row.get("Action") == "result":
            add(row.get("ReceivedAt"), "central", "result", f"{event}: {row.get('LeaderVmName')} reports "
                f"{row.get('State')} (decided by {row.get('DecidedBy')})")
        elif row.get("Action") != "expired":
            leader = f" -> leader {row['LeaderVmName']}" if row.get("LeaderVmName") else ""
            add(row.get("At"), "central", "decision", f"{event}: {row.get('Action')}, {row.get('State')} "
                f"(rule {row.get('Rule')}){leader}")

    for row in ev.tables["Events"]:
        for attempt in get_json(row, "Approvals", []) or []:
            add(attempt.get("sentAt"), "central", "approval", f"{name(row.get('EventId', ''))}: message "
                f"{attempt.get('attempt')} '{attempt.get('action')}' on queue {attempt.get('queue')} "
                f"for {attempt.get('vmName')}")

    for alert in ev.alerts:
        body = alert.get("body") or {}
        event = f"{name(body['eventId'])} " if body.get("eventId") else ""
        add(alert.get("at"), "webhook", "alert", f"{event}[{body.get('severity')}] {body.get('title')}")

    for hook in ev.hooks:
        step = "started" if hook["what"] == "start" else "finished, exit 0"
        add(hook.get("t"), hook.get("vm") or "?", "hook", f"{name(hook.get('eventId') or '')}: drain hook "
            f"{step} (asked by {hook.get('decidedBy')})")

    for post in ev.posts:
        ids = ", ".join(name(i) for i in posted_ids(post))
        add(post.get("t"), post.get("vm") or "?", "POST",
            f"StartRequests {ids} -> IMDS answered {post.get('status')}")

    order = {k: i for i, k in enumerate(("imds", "hook", "POST", "forwarder", "decision", "approval",
                                            "result", "alert"))}
    lines.sort(key=lambda line: (round(line.t, 2), order.get(line.kind, 9)))
    return lines


def render(lines: List[Line], t0: float) -> str:
    return "\n".join(f"+{line.t - t0:6.2f}s  {line.who:<8} {line.kind:<9} {line.text}" for line in lines)


def legend() -> str:
    return ("who: imds = the simulator (ground truth); vm-* = that VM's forwarder / hook / POST; "
            "central = the Function app's log store; webhook = alerts as delivered")


def summary(checks: List[Any]) -> Dict[str, int]:
    return {"passed": sum(1 for c in checks if c.ok), "failed": sum(1 for c in checks if not c.ok)}
