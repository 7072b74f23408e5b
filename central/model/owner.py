"""The Compute resource that owns a scheduled event: where ARM acknowledges it (issue 23).

One record for both sides that need it: the platform feed names it (data.resourceInfo.id, parsed by
central.intake.platform) and the ARM client posts under it (central.runtime.arm). `kind` is one of the three
Compute types the Maintenance acknowledge API takes: the VM for a standalone VM, the scale set for its
instances (Flexible and Uniform), the availability set for its VMs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional
from urllib.parse import quote

KINDS = ("virtualMachines", "virtualMachineScaleSets", "availabilitySets")
_BY_LOWER = {k.lower(): k for k in KINDS}
_ID = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/providers/microsoft\.compute/"
    r"(?P<kind>[^/]+)/(?P<name>[^/]+)(/.*)?$", re.IGNORECASE)


@dataclass(frozen=True)
class Owner:
    subscription: str
    resource_group: str
    kind: str  # virtualMachines | virtualMachineScaleSets | availabilitySets
    name: str

    def path(self) -> str:
        """The acknowledge API's base path under this owner (ARM's scheduledevents collection)."""
        if self.kind not in KINDS:
            raise ValueError(f"ARM acknowledges events of {', '.join(KINDS)}, not {self.kind!r}")
        return (f"/subscriptions/{quote(self.subscription)}/resourceGroups/{quote(self.resource_group)}"
                f"/providers/Microsoft.Compute/{self.kind}/{quote(self.name)}/providers/Microsoft.Maintenance"
                "/scheduledevents")

    def label(self) -> str:
        return f"{self.kind}/{self.name}"

    def to_json(self) -> Dict[str, str]:
        return {"subscription": self.subscription, "resourceGroup": self.resource_group, "kind": self.kind,
                "name": self.name}

    @classmethod
    def from_json(cls, doc: Any) -> Optional[Owner]:
        if not isinstance(doc, dict):
            return None
        kind = _BY_LOWER.get(str(doc.get("kind") or "").lower())
        parts = [str(doc.get(k) or "") for k in ("subscription", "resourceGroup", "name")]
        if kind is None or not all(parts):
            return None
        return cls(parts[0], parts[1], kind, parts[2])


def owner_of(resource_id: Any) -> Optional[Owner]:
    """An ARM id under a Compute resource (the scheduled event's id, or the resource's own) -> its owner
    (None: not a Compute path of one of the three kinds)."""
    if not isinstance(resource_id, str):
        return None
    m = _ID.match(resource_id)
    if m is None or m["kind"].lower() not in _BY_LOWER:
        return None
    return Owner(m["sub"], m["rg"], _BY_LOWER[m["kind"].lower()], m["name"])
