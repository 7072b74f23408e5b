"""What one State transaction writes (central.store.fleet_state commits it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

from central.model.alert import Alert
from central.model.events import EventRecord
from central.model.vms import VmState


@dataclass
class Changes:
    """What one transaction writes: new versions of VMs and events, and alerts owed by no event."""

    vms: Dict[str, VmState] = field(default_factory=dict)
    events: Dict[str, EventRecord] = field(default_factory=dict)
    alerts: List[Alert] = field(default_factory=list)
    names: Dict[str, str] = field(default_factory=dict)  # VM name -> the vmId it is bound to now

    def op_count(self) -> int:
        # an event may move from o: to x: (two operations); the head once when any event changes
        return (len(self.vms) + 2 * len(self.events) + len(self.alerts) + len(self.names)
                + (1 if self.events else 0))

    def empty(self) -> bool:
        return not (self.vms or self.events or self.alerts or self.names)
