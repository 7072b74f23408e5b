"""A simulated VM's identity: what /metadata/instance/compute answers. Defaults derive from the name."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping

_NAMESPACE = uuid.UUID("6f1c6d8e-2f57-4c1e-9a55-5ab1d0c0ffee")  # stable ids for a given name
DEFAULT_SUBSCRIPTION = str(uuid.uuid5(_NAMESPACE, "subscription"))
DEFAULT_RESOURCE_GROUP = "rg-sandbox"
DEFAULT_LOCATION = "westeurope"

_STRING_FIELDS = ("vmId", "location", "resourceGroupName", "subscriptionId", "resourceId", "vmScaleSetName",
                  "placementGroupId", "zone", "platformUpdateDomain", "platformFaultDomain", "priority",
                  "evictionPolicy", "osType", "vmSize", "azEnvironment")


@dataclass
class Identity:
    name: str
    vmId: str = ""
    location: str = DEFAULT_LOCATION
    resourceGroupName: str = DEFAULT_RESOURCE_GROUP
    subscriptionId: str = DEFAULT_SUBSCRIPTION
    resourceId: str = ""
    vmScaleSetName: str = ""
    placementGroupId: str = ""
    zone: str = ""
    platformUpdateDomain: str = "0"
    platformFaultDomain: str = "0"
    priority: str = "Regular"
    evictionPolicy: str = ""
    osType: str = "Linux"
    vmSize: str = "Standard_D2s_v5"
    azEnvironment: str = "AzurePublicCloud"
    tags: Dict[str, str] = field(default_factory=dict)

    def compute(self) -> Dict[str, Any]:
        """The /metadata/instance/compute document (tags both as IMDS's "k:v;k2:v2" and tagsList)."""
        doc = {k: v for k, v in asdict(self).items() if k != "tags"}
        doc["tags"] = ";".join(f"{k}:{v}" for k, v in self.tags.items())
        doc["tagsList"] = [{"name": k, "value": v} for k, v in self.tags.items()]
        return doc


def _parse_tags(value: Any) -> Dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, str):  # IMDS's own form "k:v;k2:v2"
        pairs = [p.split(":", 1) for p in value.split(";") if p]
        return {k: (rest[0] if rest else "") for k, *rest in pairs}
    if isinstance(value, list):  # tagsList form
        if not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in value):
            raise ValueError("tagsList must be a list of {name, value}")
        return {t["name"]: str(t.get("value", "")) for t in value}
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    raise ValueError("tags must be an object {k: v}, a list [{name, value}] or a string 'k:v;k2:v2'")


def from_spec(spec: Mapping[str, Any]) -> Identity:
    """An Identity from an admin/CLI spec; raises ValueError naming the bad field."""
    if not isinstance(spec, Mapping):
        raise ValueError("a VM spec must be a JSON object with at least 'name'")
    name = spec.get("name")
    if not isinstance(name, str) or not name or "/" in name or len(name) > 256:
        raise ValueError("'name' is required: a non-empty string without '/' (at most 256 characters)")
    values: Dict[str, Any] = {}
    for key in _STRING_FIELDS:
        if key in spec and spec[key] is not None:
            if not isinstance(spec[key], (str, int)) or isinstance(spec[key], bool):
                raise ValueError(f"'{key}' must be a string")
            values[key] = str(spec[key])
    tags = _parse_tags(spec.get("tags", spec.get("tagsList")))
    ident = Identity(name=name, tags=tags, **values)
    if not ident.vmId:
        ident.vmId = str(uuid.uuid5(_NAMESPACE, f"vm/{name}"))
    if not ident.resourceId:
        ident.resourceId = _resource_id(ident)
    return ident


def moved(ident: Identity, spec: Mapping[str, Any]) -> None:
    """Azure's resource move: the VM keeps its vmId and name, and takes the subscription and/or resource
    group `spec` names (its resourceId follows). Raises ValueError naming a bad field."""
    fields = {k: spec[k] for k in ("subscriptionId", "resourceGroupName") if k in spec}
    if not fields or set(spec) - set(fields):
        raise ValueError("a move names 'subscriptionId' and/or 'resourceGroupName', nothing else")
    for key, value in fields.items():  # all checked before any is set: a refused move changes nothing
        if not isinstance(value, str) or not value or "/" in value:
            raise ValueError(f"'{key}' must be a non-empty string without '/'")
    for key, value in fields.items():
        setattr(ident, key, value)
    ident.resourceId = _resource_id(ident)


def _resource_id(ident: Identity) -> str:
    base = (f"/subscriptions/{ident.subscriptionId}/resourceGroups/{ident.resourceGroupName}"
            "/providers/Microsoft.Compute/")
    if ident.vmScaleSetName:
        # Uniform scale-set instance names are {vmss}_{instanceId}.
        instance = ident.name.rsplit("_", 1)[-1] if "_" in ident.name else ident.name
        return base + f"virtualMachineScaleSets/{ident.vmScaleSetName}/virtualMachines/{instance}"
    return base + f"virtualMachines/{ident.name}"


def names(identities: List[Identity]) -> List[str]:
    return [i.name for i in identities]
