"""What central knows about each VM: identity and grouping, liveness, and its latest IMDS state."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Dict, List, Optional

from schemas import authn as wire


@dataclass
class VmState:
    vm_id: str
    name: str
    resource_id: str = ""
    scale_set: str = ""
    placement_group: str = ""
    zone: str = ""
    tags: Dict[str, str] = field(default_factory=dict)  # as it reports them now: rules on its own events
    # its tags at first sight: the budget groups it counts in (a VM's later claim cannot move it into
    # another group's budget). Set by bind_identity, or bound on load for rows from before the field
    # (rows.vm_from_entity); None only for a VmState built without either (tools, tests): tags stand in
    group_tags: Optional[Dict[str, str]] = None
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
    name_bound: bool = True  # this VM holds its name (central.names); False once another VM took it over
    new_events_since: Optional[datetime] = None  # start of the hour its new events are counted in
    new_events: int = 0
    # when central first authenticated an envelope from it (any AUTHN_MODE but off): from then on its
    # unsigned envelopes are refused as a downgrade, on every instance (central.intake.downgrade)
    signed_at: Optional[datetime] = None

    def count_new_event(self, at: datetime, limit: int) -> bool:
        """Count one event this VM reports first; False when it already brought `limit` this hour."""
        if self.new_events_since is None or at - self.new_events_since >= timedelta(hours=1):
            self.new_events_since, self.new_events = at, 0
        if self.new_events >= limit:
            return False
        self.new_events += 1
        return True

    def bind_identity(self, vm: Dict[str, Any]) -> None:
        """A new VM's identity and grouping from its first envelope's data.vm."""
        self.resource_id = vm.get("resourceId") or ""
        self.scale_set = vm.get("vmScaleSetName") or ""
        self.placement_group = vm.get("placementGroupId") or ""
        self.zone = vm.get("zone") or ""
        self.update_tags(vm)
        self.group_tags = dict(self.tags)

    def follow_subscription(self, resource_id: Any) -> None:
        """A resourceId whose subscription Azure vouched for (a signed envelope's) replaces the bound one when
        that names another subscription: bound unsigned, before the check, or before Azure moved the VM.
        Within one subscription the resourceId stays as first seen: the resource group is not attested, and
        a VM must not move itself out of a PLATFORM_CONFIRM_SCOPES scope or to another ARM owner."""
        claimed = wire.resource_id_subscription(resource_id)
        if claimed and claimed.lower() != wire.resource_id_subscription(self.resource_id).lower():
            self.resource_id = str(resource_id)

    def update_tags(self, vm: Dict[str, Any]) -> None:
        """Tags can change on a VM; its name, scale set, placement group and zone cannot (central.names).
        A change steers rules on this VM's own events; its budget groups stay those of first sight."""
        if isinstance(vm.get("tags"), dict):
            self.tags = {str(k): str(v) for k, v in vm["tags"].items()}

    @property
    def budget_tags(self) -> Dict[str, str]:
        """The tags budget groups read: bound at first sight (IMDS's, before anyone could claim others)."""
        return self.tags if self.group_tags is None else self.group_tags

    def identity_conflicts(self, vm: Dict[str, Any]) -> Dict[str, str]:
        """What an envelope's data.vm says differently from what this VM is bound to (name, scale set,
        placement group, zone: fixed for a vmId in Azure)."""
        out: Dict[str, str] = {}
        for key, have in (("name", self.name), ("vmScaleSetName", self.scale_set),
                          ("placementGroupId", self.placement_group), ("zone", self.zone)):
            said = vm.get(key) or ""
            if key == "name" and not said:
                continue
            if said != have:
                out[key] = f"{str(said)[:64]!r}, bound as {have!r}"
        return out

    def seen(self, moment: datetime) -> None:
        if self.last_seen is None or moment > self.last_seen:
            self.last_seen = moment

    def heard_since(self, moment: datetime) -> bool:
        """Central received anything from it (heartbeat or envelope) at `moment` or later."""
        return self.last_seen is not None and self.last_seen >= moment

    def live(self, now: datetime, liveness: timedelta) -> bool:
        """A forwarder is live when it sent anything (heartbeat or envelope) within `liveness`."""
        return self.heard_since(now - liveness)
