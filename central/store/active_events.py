"""FleetState's cached active events, with the ids changed since a follower last asked (and the VMs
that reported them, by name, and the events that owe alerts).

A follower keeps an index of its own over the active events (the events waiting for a budget slot, by
group: central.runtime.inline.WaitingGroups) and brings it up to date from the ids changed since its last
look instead of scanning thousands of active events on every call of a 100k wave. One follower: `take_changed`
hands the changes over. When nobody asks for a long time the record of changes is dropped and the next
`take_changed` answers None: look at everything.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Set, Tuple

from central.model.events import EventRecord

Entry = Tuple[EventRecord, str]  # (record, ETag of its o: row)


class ActiveEvents(Dict[str, Entry]):
    """EventId -> (record, ETag). Change it by key (`[k] = v`, `pop`, `del`): those are what it records."""

    def __init__(self) -> None:
        super().__init__()
        self._changed: Optional[Set[str]] = None  # None: everything (new, or too long since asked)
        # VM name -> a vmId that reported an event cached here under it: name hints (central.store.vm_reads),
        # kept as events are set instead of found by scanning every active event on each VM read
        self.reporters: Dict[str, str] = {}
        # the events whose rows owe alerts: what delivering looks at, instead of every active event per call
        self.owing: Dict[str, None] = {}  # (a dict: in the order the events were cached, as a scan had them)

    def _note(self, event_id: str) -> None:
        if self._changed is not None:
            self._changed.add(event_id)
            if len(self._changed) > 2 * len(self) + 1000:  # unread for long: cheaper to look at everything
                self._changed = None

    def __setitem__(self, event_id: str, entry: Entry) -> None:
        before = self.get(event_id)
        super().__setitem__(event_id, entry)
        self.reporters.update(entry[0].reported_by)
        if entry[0].pending_alerts:
            self.owing[event_id] = None
        else:
            self.owing.pop(event_id, None)
        if before is None or not entry[1] or before[1] != entry[1]:  # (the same ETag: the same row, re-read)
            self._note(event_id)

    def __delitem__(self, event_id: str) -> None:
        super().__delitem__(event_id)
        self.owing.pop(event_id, None)
        self._note(event_id)

    def pop(self, event_id: str, *default: Any) -> Any:  # type: ignore[override]
        self._note(event_id)
        self.owing.pop(event_id, None)
        return super().pop(event_id, *default)

    def replace_all(self, entries: Dict[str, Entry]) -> None:
        """Hold exactly `entries` (a reload of every active row): only the ids whose rows differ are
        recorded as changed (a row kept with its ETag is the same row), and the name hints start again
        from these events."""
        for event_id in [e for e in self if e not in entries]:
            del self[event_id]
        self.reporters = {}
        for event_id, entry in entries.items():
            self[event_id] = entry

    def take_changed(self) -> Optional[Set[str]]:
        """The ids set or removed since the last call (None: look at every entry); starts a new record."""
        changed, self._changed = self._changed, set()
        return changed
