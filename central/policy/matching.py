"""Pure rule matching: one wildcard rule for every match field, and the reasons a rule does not fit.

Every name condition (vmNames, scaleSets, placementGroups, zones, resourceGroups, subscriptions) and
every tag value takes the same patterns: fnmatch `*`, `?`, `[seq]`. A pattern only fits a value the
VM has (`"scaleSets": ["*"]` = in any scale set; a standalone VM is in none). Names Azure compares
case-insensitively (VMs, scale sets, placement groups, zones, resource groups, subscriptions) match
case-insensitively; tag values keep their case (Azure stores them as given); tag names are exact.

`misses(...)` returns why a match does not fit (empty = fits); `fits(...)` is the same answer without
building the reasons (central's hot path).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Dict, List, Mapping, Optional, Sequence

from central.model.vms import VmState

EVENT_KEYS = ("eventTypes", "eventSources", "durationInSeconds")
NAME_KEYS = ("vmNames", "scaleSets", "placementGroups", "zones", "resourceGroups", "subscriptions")
VM_KEYS = ("tags", *NAME_KEYS)
WILDCARDS = frozenset("*?[")


@dataclass(frozen=True)
class Miss:
    """One condition that did not hold: the match key, what the rule wants, what the event/VM has."""

    key: str
    wanted: Any
    got: Any
    vm: Optional[str] = None  # the VM (name) this is about, for VM conditions

    def to_json(self) -> Dict[str, Any]:
        out = {"key": self.key, "wanted": self.wanted, "got": self.got}
        if self.vm is not None:
            out["vm"] = self.vm
        return out


def resource_id_part(resource_id: str, segment: str) -> str:
    """The value after `/<segment>/` in an ARM resource id (case-insensitive), or ''."""
    parts = resource_id.strip("/").split("/")
    for i in range(0, len(parts) - 1, 2):
        if parts[i].lower() == segment.lower():
            return parts[i + 1]
    return ""


def resource_group_of(vm: VmState) -> str:
    return resource_id_part(vm.resource_id, "resourceGroups")


def subscription_of(vm: VmState) -> str:
    return resource_id_part(vm.resource_id, "subscriptions")


def name_value(vm: VmState, key: str) -> str:
    """The VM's value for a name condition (one of NAME_KEYS); '' when it has none."""
    if key == "vmNames":
        return vm.name
    if key == "scaleSets":
        return vm.scale_set
    if key == "placementGroups":
        return vm.placement_group
    if key == "zones":
        return vm.zone
    if key == "resourceGroups":
        return resource_group_of(vm)
    return subscription_of(vm)


def name_fits(value: str, patterns: Sequence[str]) -> bool:
    """A present value fits one of the patterns (case-insensitive fnmatch)."""
    if not value:
        return False
    folded = value.casefold()
    for pattern in patterns:
        wanted = pattern.casefold()
        if folded == wanted or (has_wildcard(wanted) and fnmatchcase(folded, wanted)):
            return True
    return False


def tag_fits(value: Optional[str], accepted: Any) -> bool:
    """A present tag value fits the accepted value or one of the list (case-sensitive fnmatch)."""
    if value is None:
        return False
    patterns = [accepted] if isinstance(accepted, str) else accepted
    return any(value == p or (has_wildcard(p) and fnmatchcase(value, p)) for p in patterns)


def duration_fits(duration: int, rng: Mapping[str, int]) -> bool:
    """min inclusive, max exclusive."""
    return not (("min" in rng and duration < rng["min"]) or ("max" in rng and duration >= rng["max"]))


def event_misses(match: Mapping[str, Any], event_type: str, source: str, duration: int) -> List[Miss]:
    out: List[Miss] = []
    if "eventTypes" in match and event_type not in match["eventTypes"]:
        out.append(Miss("eventTypes", list(match["eventTypes"]), event_type))
    if "eventSources" in match and source not in match["eventSources"]:
        out.append(Miss("eventSources", list(match["eventSources"]), source))
    rng = match.get("durationInSeconds")
    if rng is not None and not duration_fits(duration, rng):
        out.append(Miss("durationInSeconds", dict(rng), duration))
    return out


def vm_misses(match: Mapping[str, Any], vm: VmState) -> List[Miss]:
    """Every VM condition of `match` this VM does not fit."""
    out: List[Miss] = []
    for tag, accepted in (match.get("tags") or {}).items():
        have = vm.tags.get(tag)
        if not tag_fits(have, accepted):
            out.append(Miss(f"tags.{tag}", accepted, have, vm.name))
    for key in NAME_KEYS:
        if key in match:
            have = name_value(vm, key)
            if not name_fits(have, match[key]):
                out.append(Miss(key, list(match[key]), have or None, vm.name))
    return out


def has_vm_conditions(match: Mapping[str, Any]) -> bool:
    return not match.keys().isdisjoint(VM_KEYS)


def fits(
    match: Mapping[str, Any], event_type: str, source: str, duration: int, vms: Sequence[VmState]
) -> bool:
    """All event conditions hold and, when there are VM conditions, at least one VM fits them all.
    The same answer as `not misses(...)`, without building reasons (central's hot path)."""
    if "eventTypes" in match and event_type not in match["eventTypes"]:
        return False
    if "eventSources" in match and source not in match["eventSources"]:
        return False
    rng = match.get("durationInSeconds")
    if rng is not None and not duration_fits(duration, rng):
        return False
    if has_vm_conditions(match):
        return any(_vm_fits(match, vm) for vm in vms)
    return True


def _vm_fits(match: Mapping[str, Any], vm: VmState) -> bool:
    for tag, accepted in (match.get("tags") or {}).items():
        if not tag_fits(vm.tags.get(tag), accepted):
            return False
    return all(name_fits(name_value(vm, key), match[key]) for key in NAME_KEYS if key in match)


def misses(
    match: Mapping[str, Any], event_type: str, source: str, duration: int, vms: Sequence[VmState]
) -> List[Miss]:
    """Why the match does not fit (empty: it fits). A VM condition's misses are listed per VM;
    with no VM known to central, one Miss with key "vms" says so."""
    found = event_misses(match, event_type, source, duration)
    if has_vm_conditions(match):
        per_vm = [vm_misses(match, vm) for vm in vms]
        if not vms:
            found.append(Miss("vms", "a VM central knows that fits the VM conditions", []))
        elif all(per_vm):
            found.extend(m for vm_list in per_vm for m in vm_list)
    return found


def has_wildcard(pattern: str) -> bool:
    return not WILDCARDS.isdisjoint(pattern)
