"""What changed between two scheduled-events documents: new, changed and gone events (by EventId)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class Diff:
    new: List[Dict[str, Any]] = field(default_factory=list)
    changed: List[Dict[str, Any]] = field(default_factory=list)  # [{"before": ev, "after": ev}]
    gone: List[Dict[str, Any]] = field(default_factory=list)      # last known state of vanished events

    def as_dict(self) -> Dict[str, Any]:
        return {"new": self.new, "changed": self.changed, "gone": self.gone}

    def __bool__(self) -> bool:
        return bool(self.new or self.changed or self.gone)


def _by_id(document: Optional[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    events = (document or {}).get("Events") or []
    return {str(ev["EventId"]): ev for ev in events if isinstance(ev, dict) and "EventId" in ev}


def diff(before: Optional[Dict[str, Any]], after: Dict[str, Any]) -> Diff:
    """Events in `after` not in `before` are new; in both but different are changed; only in
    `before` are gone (completed or cancelled). `before` None means first sight: all are new."""
    old, cur = _by_id(before), _by_id(after)
    result = Diff()
    for event_id, event in cur.items():
        if event_id not in old:
            result.new.append(event)
        elif old[event_id] != event:
            result.changed.append({"before": old[event_id], "after": event})
    result.gone = [event for event_id, event in old.items() if event_id not in cur]
    return result
