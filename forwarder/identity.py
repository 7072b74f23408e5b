"""The VM's identity and grouping, from IMDS instance compute metadata -> the envelope's `vm` object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

# (compute metadata key, envelope key, max length from envelope.schema.json#/$defs/vm)
_FIELDS = (
    ("vmId", "vmId", 64),
    ("name", "name", 256),
    ("resourceId", "resourceId", 1024),
    ("subscriptionId", "subscriptionId", 64),
    ("resourceGroupName", "resourceGroupName", 256),
    ("location", "location", 64),
    ("vmScaleSetName", "vmScaleSetName", 256),
    ("placementGroupId", "placementGroupId", 256),
    ("zone", "zone", 16),
    ("platformUpdateDomain", "platformUpdateDomain", 16),
    ("platformFaultDomain", "platformFaultDomain", 16),
    ("osType", "osType", 32),
    ("priority", "priority", 32),
)
MAX_TAGS = 50


class IdentityError(ValueError):
    """Compute metadata lacks what identifies the VM (vmId and name): IMDS answered something odd."""


@dataclass(frozen=True)
class VmIdentity:
    vm_id: str
    name: str
    fields: Dict[str, str] = field(default_factory=dict)  # the other non-empty string fields
    tags: Dict[str, str] = field(default_factory=dict)

    @property
    def resource_id(self) -> Optional[str]:
        return self.fields.get("resourceId") or None

    @property
    def source(self) -> str:
        """CloudEvents `source`: the resource id, or vm://<vmId> when IMDS gives none."""
        return self.resource_id or f"vm://{self.vm_id}"

    def as_vm(self) -> Dict[str, Any]:
        """The envelope's `vm` object."""
        vm: Dict[str, Any] = {"vmId": self.vm_id, "name": self.name, **self.fields}
        if self.tags:
            vm["tags"] = dict(self.tags)
        return vm


def _tags(compute: Dict[str, Any]) -> Dict[str, str]:
    tags: Dict[str, str] = {}
    tags_list = compute.get("tagsList")
    if isinstance(tags_list, list):
        for item in tags_list:
            if isinstance(item, dict) and item.get("name"):
                tags[str(item["name"])] = str(item.get("value", ""))[:512]
    elif isinstance(compute.get("tags"), str) and compute["tags"]:
        # older api-versions: "k1:v1;k2:v2"
        for pair in compute["tags"].split(";"):
            key, _, value = pair.partition(":")
            if key:
                tags[key] = value[:512]
    return dict(list(tags.items())[:MAX_TAGS])


def from_compute(compute: Dict[str, Any]) -> VmIdentity:
    """Build the identity from /metadata/instance/compute. Raises IdentityError without vmId/name."""
    vm_id = str(compute.get("vmId") or "").strip()
    name = str(compute.get("name") or "").strip()
    if not vm_id or not name:
        raise IdentityError("IMDS compute metadata has no vmId/name; is --imds-url an IMDS endpoint?")
    fields: Dict[str, str] = {}
    for src, dst, limit in _FIELDS[2:]:
        value = compute.get(src)
        if value is None or value == "":
            continue
        fields[dst] = str(value)[:limit]
    return VmIdentity(vm_id=vm_id[:64], name=name[:256], fields=fields, tags=_tags(compute))
