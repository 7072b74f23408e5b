"""What central knows about each VM: identity and grouping, liveness, and its latest IMDS state."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Dict, List, Optional


@dataclass
class VmState:
    vm_id: str
    name: str
    resource_id: str = ""
    scale_set: str = ""
    placement_group: str = ""
    zone: str = ""
    tags: Dict[str, str] = field(default_factory=dict)
    last_seen: Optional[datetime] = None  # when central last received anything from it (enqueued time)
    last_heartbeat: Optional[datetime] = None
    forwarder_version: str = ""
    incarnation: Optional[int] = None  # the incarnation whose document is applied
    incarnation_observed: Optional[datetime] = None  # central's receive time of that incarnation
    applied_envelope: str = ""  # the envelope id of the applied incarnation (a replay is recognised)
    listed: List[str] = field(default_factory=list)  # EventIds in that document
    outbox_dropped: int = 0
    outbox_backlog: int = 0
    heartbeat_logged: Optional[datetime] = None  # last `se.heartbeat` log marker (monitoring)

    def update_identity(self, vm: Dict[str, Any]) -> None:
        """Refresh grouping from an envelope's data.vm (tags can change)."""
        self.name = vm.get("name") or self.name
        self.resource_id = vm.get("resourceId", self.resource_id) or ""
        self.scale_set = vm.get("vmScaleSetName", self.scale_set) or ""
        self.placement_group = vm.get("placementGroupId", self.placement_group) or ""
        self.zone = vm.get("zone", self.zone) or ""
        if isinstance(vm.get("tags"), dict):
            self.tags = {str(k): str(v) for k, v in vm["tags"].items()}

    def seen(self, moment: datetime) -> None:
        if self.last_seen is None or moment > self.last_seen:
            self.last_seen = moment

    def live(self, now: datetime, liveness: timedelta) -> bool:
        """A forwarder is live when it sent anything (heartbeat or envelope) within `liveness`."""
        return self.last_seen is not None and now - self.last_seen <= liveness
