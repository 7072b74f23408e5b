"""Budget-group tags (issue 24, item 4): which disruption-budget groups a change to an event may matter to.

Deciding about one event reads other events only through its budgets' group counts and the events waiting
for a slot in those groups (central.policy.fleet_view.seen_by_others). So a change to an event whose VMs
count in groups A and B cannot change a decision whose event counts only in C. The head's change log
(central.store.head_log) carries, with each changed event, short tags of its groups (before and after the
change); a cache catching up reads now the changed events of the groups it is about to decide in and
defers the rest until a decision asks for one of their groups (FleetView raises StaleGroups: the caller
reads them and decides again). With the forwarder's partition key the VM's scale set, each instance mostly
decides in the groups of its own partitions, and reads little of what the others change.

Pure. A tag is 8 hex digits of the group key's hash: two groups sharing a tag only make a cache read more.
Tags compare only under the same budgets' groupings, so each log line carries the writer's `fingerprint`;
a line under another fingerprint (a policy being changed, the shadow policy added) counts as untagged:
read by everyone, as before tags existed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Dict, FrozenSet, Iterable, Optional, Sequence, Tuple

from central.model.vms import VmState

from .budgets import Budget

Tags = FrozenSet[str]
RECENT = timedelta(minutes=5)  # an instance keeps reading the changes of the groups it decided in this long


@lru_cache(maxsize=65_536)
def tag(group: str) -> str:
    """A budget group key's tag (central.policy.budgets.Budget.group_of)."""
    return hashlib.blake2s(group.encode("utf-8"), digest_size=4).hexdigest()


class StaleGroups(Exception):
    """A decision asked for a budget group some of whose changed events this cache has not read yet
    (deferred by a catch-up): read them (central.store.event_reads) and decide again."""

    def __init__(self, tags: Tags) -> None:
        super().__init__(f"budget group tags not caught up: {sorted(tags)[:5]}")
        self.tags = tags


@dataclass(frozen=True)
class Grouping:
    """The budgets' groupings a log's tags are made under (the policy's and the shadow policy's budgets)."""

    budgets: Tuple[Budget, ...]
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        kinds = sorted({(b.name, b.group_by, b.tag) for b in self.budgets})
        object.__setattr__(self, "fingerprint",
                           hashlib.blake2s(repr(kinds).encode("utf-8"), digest_size=4).hexdigest())

    @classmethod
    def of(cls, budgets: Sequence[Budget]) -> Grouping:
        return cls(tuple(budgets))

    def tags_of(self, vms: Iterable[Optional[VmState]]) -> Optional[Tags]:
        """The tags of every group these VMs count in; None when one is not known (None) and its groups
        depend on it (not with no budgets, or only fleet-wide ones): whoever reads the change then reads it
        whatever it decides in."""
        out = set()
        for vm in vms:
            if vm is None:
                if any(b.group_by != "fleet" for b in self.budgets):
                    return None
                out.update(tag(f"{b.name}:fleet") for b in self.budgets)
                continue
            for budget in self.budgets:
                group = budget.group_of(vm)
                if group:
                    out.add(tag(group))
        return frozenset(out)


@dataclass
class RecentGroups:
    """The groups an instance decided in lately: its catch-ups keep reading their changes too. Where each
    instance decides in every group (VMs routed by vmId, a zone budget spanning scale sets), that is every
    group, and a catch-up reads what changed in one query, as before tags; where each decides in its own
    (the forwarder's scale-set key), the others' stay deferred."""

    within: timedelta = RECENT
    seen: Dict[str, datetime] = field(default_factory=dict)

    def widen(self, tags: Optional[Tags], now: datetime) -> Optional[Tags]:
        """`tags` and those seen within `within` of `now` (None: every group, as given)."""
        if tags is None:
            return None
        for t in tags:
            self.seen[t] = now
        oldest = now - self.within
        for t in [t for t, at in self.seen.items() if at < oldest]:
            del self.seen[t]
        return frozenset(self.seen)
