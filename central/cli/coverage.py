"""`se-fleet coverage`, the pure part: which VMs of a scope are covered, and how. The Resource Graph
queries (KQL over `resources`, `computeresources` and `authorizationresources`), their rows turned into
VMs, and one verdict per VM from those and central's fleet view (GET /api/fleet):

- agent: a forwarder central heard within its silence threshold (the fleet view's `silent` false);
- agentless: the owner of the VM's events (the VM, its availability set or its scale set) is opted into
  the platform feed and central's identity holds Scheduled Events Contributor there (or above), so
  central may approve through ARM;
- silent agent: the forwarder is installed (its CustomScript extension on the VM or the scale set's model,
  or central knows the VM) but not heard;
- blind: neither: Azure may reboot it at NotBefore with nobody told;
- excluded: tagged <tag>: off (infra/coverage/: left alone on purpose); listed, not blind.
The I/O (Resource Graph, central) is central/cli/coverage_command.py's."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

AGENT, AGENTLESS, SILENT_AGENT, BLIND, EXCLUDED = "agent", "agentless", "silent agent", "blind", "excluded"
VERDICTS = (AGENT, AGENTLESS, SILENT_AGENT, BLIND, EXCLUDED)
WORST_FIRST = (BLIND, SILENT_AGENT, EXCLUDED, AGENTLESS, AGENT)
SCHEDULED_EVENTS_CONTRIBUTOR = "b67fe603-310e-4889-b9ee-8257d09d353d"
EXTENSION_PREFIX = "se-forwarder-install"  # infra/forwarder/install-vm*.bicep and infra/coverage/ name it so
GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
GROUP_NAME = re.compile(r"^[-\w._()]{1,90}$")
VM_TYPE = "microsoft.compute/virtualmachines"
INSTANCE_TYPE = "microsoft.compute/virtualmachinescalesets/virtualmachines"
EXTENSION_TYPE = "microsoft.compute/virtualmachines/extensions"
OWNER_TYPES = ("microsoft.compute/virtualmachinescalesets", "microsoft.compute/availabilitysets")
FEED = "properties.scheduledEventsPolicy.scheduledEventsAdditionalPublishingTargets.eventGridAndResourceGraph"


def inventory_query(resource_group: str = "") -> str:
    """VMs, scale sets, availability sets and the forwarder's VM extensions (`resources`), and Uniform
    scale sets' instances (`computeresources`: microsoft.compute/virtualmachinescalesets/virtualmachines
    is there, not in `resources`)."""
    where = f'\n| where resourceGroup =~ "{resource_group}"' if resource_group else ""
    return (
        "resources\n"
        f'| where type in~ ("{VM_TYPE}", "{OWNER_TYPES[0]}", "{OWNER_TYPES[1]}")'
        f' or (type =~ "{EXTENSION_TYPE}" and name startswith "{EXTENSION_PREFIX}"){where}\n'
        "| project id, name, type, subscriptionId, resourceGroup, tags, vmId = tostring(properties.vmId),\n"
        "    owner = coalesce(tostring(properties.availabilitySet.id), "
        "tostring(properties.virtualMachineScaleSet.id)),\n"
        f"    feed = tobool({FEED}.enable),\n"
        "    orchestrationMode = tostring(properties.orchestrationMode),\n"
        "    extensions = properties.virtualMachineProfile.extensionProfile.extensions,\n"
        "    provisioningState = tostring(properties.provisioningState)\n"
        "| union (computeresources\n"
        f'    | where type =~ "{INSTANCE_TYPE}"{where.replace(chr(10), " ")}\n'
        "    | project id, name, type, subscriptionId, resourceGroup, tags,\n"
        "        vmId = tostring(properties.vmId))\n"
        "| order by id asc")


def role_query(central_principal_id: str) -> str:
    """Where central's identity holds Scheduled Events Contributor (`authorizationresources`)."""
    if not GUID.match(central_principal_id):
        raise ValueError(f"central's principal id {central_principal_id!r} is not a GUID "
                         "(FUNCTION_PRINCIPAL_ID output of infra/main.bicep)")
    return ('authorizationresources\n| where type =~ "microsoft.authorization/roleassignments"\n'
            f'| where tostring(properties.roleDefinitionId) endswith "/{SCHEDULED_EVENTS_CONTRIBUTOR}"\n'
            f'| where tostring(properties.principalId) =~ "{central_principal_id}"\n'
            "| project id, scope = tostring(properties.scope)\n| order by id asc")


@dataclass(frozen=True)
class Machine:
    """One VM of the scope as Resource Graph shows it."""
    id: str
    name: str
    subscription: str
    resource_group: str
    vm_id: str
    owner: str  # the resource that owns its scheduled events (the VM itself, its set, its scale set)
    installed: bool  # the forwarder's extension on it (or on its Uniform scale set's model)
    opted_in: bool  # the owner's platform feed is on
    excluded: bool  # tagged <tag>: off (a Uniform instance: its scale set)


@dataclass(frozen=True)
class Covered:
    machine: Machine
    verdict: str
    heard: Optional[str]  # central's lastSeen, if it knows the VM


def _lower(value: Any) -> str:
    return str(value or "").lower()


def _excluded(tags: Any, tag: str, off: str) -> bool:
    if not isinstance(tags, Mapping):
        return False
    return any(k.lower() == tag.lower() and str(v).lower() == off.lower() for k, v in tags.items())


def machines(rows: Iterable[Mapping[str, Any]], tag: str = "se-forwarder", off: str = "off") -> List[Machine]:
    """The VMs among Resource Graph's rows (inventory_query's), each with its owner's state."""
    rows = list(rows)
    owners = {_lower(r["id"]): r for r in rows if _lower(r.get("type")) in (*OWNER_TYPES, VM_TYPE)}
    extensions = {_lower(r["id"]).rsplit("/extensions/", 1)[0] for r in rows
                  if _lower(r.get("type")) == EXTENSION_TYPE
                  and _lower(r.get("provisioningState")) in ("succeeded", "")}
    # a VM listed both ways (a Flexible member, should computeresources hold it too) is counted once
    as_vm = {_lower(r.get("vmId")) for r in rows if _lower(r.get("type")) == VM_TYPE and r.get("vmId")}
    out = []
    for row in rows:
        kind, key = _lower(row.get("type")), _lower(row.get("id"))
        if kind == INSTANCE_TYPE and _lower(row.get("vmId")) in as_vm:
            continue
        if kind == VM_TYPE:
            owner = _lower(row.get("owner")) or key
            installed = key in extensions
        elif kind == INSTANCE_TYPE:
            owner = key.rsplit("/virtualmachines/", 1)[0]
            model = (owners.get(owner) or {}).get("extensions") or []
            installed = any(_lower(e.get("name")).startswith(EXTENSION_PREFIX) for e in model
                            if isinstance(e, Mapping))
        else:
            continue
        owner_row = owners.get(owner) or {}
        out.append(Machine(
            id=str(row["id"]), name=str(row.get("name", "")), subscription=_lower(row.get("subscriptionId")),
            resource_group=_lower(row.get("resourceGroup")), vm_id=_lower(row.get("vmId")), owner=owner,
            installed=installed, opted_in=owner_row.get("feed") is True,
            # read where the policies read it: a VM's own tag; a Uniform instance's scale set's
            excluded=_excluded(row.get("tags"), tag, off) or
            (kind == INSTANCE_TYPE and _excluded(owner_row.get("tags"), tag, off))))
    return out


def approvable(owner: str, role_scopes: Sequence[str]) -> bool:
    """Central's role at the owner or at a scope above it (resource group, subscription, ...)."""
    owner = owner.lower()
    return any(owner == s or owner.startswith(s.rstrip("/") + "/") for s in (x.lower() for x in role_scopes))


def verdict(machine: Machine, fleet_vm: Optional[Mapping[str, Any]], role_scopes: Sequence[str]) -> str:
    """One VM's verdict (module docstring). `fleet_vm`: central's row for its vmId, if any."""
    if fleet_vm is not None and not fleet_vm.get("silent", True):
        return AGENT
    if machine.opted_in and approvable(machine.owner, role_scopes):
        return AGENTLESS
    if machine.excluded:
        return EXCLUDED
    if machine.installed or fleet_vm is not None:
        return SILENT_AGENT
    return BLIND


def cover(found: Sequence[Machine], fleet: Mapping[str, Any], role_scopes: Sequence[str]) -> List[Covered]:
    """Every VM with its verdict; central's fleet joined by vmId."""
    by_id = {_lower(v.get("vmId")): v for v in fleet.get("vms", []) if v.get("vmId")}
    out = []
    for machine in found:
        row = by_id.get(machine.vm_id) if machine.vm_id else None
        out.append(Covered(machine, verdict(machine, row, role_scopes), (row or {}).get("lastSeen")))
    return out


def counts(covered: Sequence[Covered]) -> Dict[str, Any]:
    """Totals by verdict, and by subscription and resource group."""
    total = Counter(c.verdict for c in covered)
    groups: Dict[Tuple[str, str], Counter] = {}
    for c in covered:
        groups.setdefault((c.machine.subscription, c.machine.resource_group), Counter())[c.verdict] += 1
    return {
        "vms": len(covered),
        "byVerdict": {v: total.get(v, 0) for v in VERDICTS},
        "byResourceGroup": [{"subscription": s, "resourceGroup": g, **{v: n.get(v, 0) for v in VERDICTS}}
                            for (s, g), n in sorted(groups.items())],
    }


def report(covered: Sequence[Covered]) -> Dict[str, Any]:
    """The --json document."""
    return {**counts(covered),
            "machines": [{**asdict(c.machine), "verdict": c.verdict, "heard": c.heard} for c in covered]}


def render(covered: Sequence[Covered], blind_only: bool = False) -> str:
    rows = [("VM", "SUBSCRIPTION", "RESOURCE GROUP", "VERDICT", "HEARD")]
    for c in sorted(covered, key=lambda c: (WORST_FIRST.index(c.verdict), c.machine.id.lower())):
        if blind_only and c.verdict != BLIND:
            continue
        rows.append((c.machine.name, c.machine.subscription, c.machine.resource_group, c.verdict.upper()
                     if c.verdict == BLIND else c.verdict, c.heard or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(col.ljust(widths[i]) for i, col in enumerate(r)).rstrip() for r in rows]
    summary = counts(covered)
    lines.append("")
    for group in summary["byResourceGroup"]:
        lines.append(f"{group['subscription']}/{group['resourceGroup']}: " +
                     ", ".join(f"{group[v]} {v}" for v in VERDICTS if group[v]))
    lines.append(f"{summary['vms']} VM(s): " + ", ".join(f"{summary['byVerdict'][v]} {v}" for v in VERDICTS))
    return "\n".join(lines)
