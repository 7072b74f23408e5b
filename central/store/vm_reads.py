"""The State table's VM and name rows, read into FleetState's cache (a mixin of central.store.fleet_state)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Dict, Iterable, List, Optional, Tuple

from central.model.vms import VmState
from central.store import state_rows as rows

from .tables import TableLog

TABLE = "State"
KEYS_PER_QUERY = 14  # Azure Tables: at most 15 comparisons in one filter
NEVER = datetime.min.replace(tzinfo=timezone.utc)


def chunks(items: List[str], size: int) -> Iterable[List[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class VmReads:
    store: TableLog
    vms: Dict[str, Tuple[VmState, Optional[str]]]  # vmId -> (state, etag)
    names: Dict[str, Tuple[str, Optional[str]]]  # VM name -> (bound vmId, etag); read ones
    named: Dict[str, VmState]  # VM name -> its row as vms_by_name last read it
    reads: int

    def vm(self, vm_id: str) -> Optional[VmState]:
        found = self.vms.get(vm_id)
        return found[0] if found else None

    def load_vms(self, vm_ids: Iterable[str], force: bool = False) -> None:
        """Read the VM rows not cached (or all of them, `force`), 14 keys per query."""
        wanted = sorted({v for v in vm_ids if force or v not in self.vms})
        for chunk in chunks(wanted, KEYS_PER_QUERY):
            params = {f"k{i}": rows.vm_key(v) for i, v in enumerate(chunk)}
            params["p"] = rows.PARTITION
            filter_ = (
                "PartitionKey eq @p and ( "
                + " or ".join(f"RowKey eq @k{i}" for i in range(len(chunk)))
                + " )"
            )
            found = {
                e["VmId"]: (rows.vm_from_entity(e), etag)
                for e, etag in self.store.query_with_etags(TABLE, filter_, params)
            }
            self.reads += 1
            for vm_id in chunk:
                if vm_id in found:
                    self.vms[vm_id] = found[vm_id]
                else:
                    self.vms.pop(vm_id, None)

    def load_names(self, names: Iterable[str], force: bool = False) -> None:
        """Read the name bindings not cached (or all, `force`), 14 keys per query; an unbound name is
        cached as ("", None)."""
        wanted = sorted({n for n in names if force or n not in self.names})
        for chunk in chunks(wanted, KEYS_PER_QUERY):
            params = {f"k{i}": rows.name_key(n) for i, n in enumerate(chunk)}
            params["p"] = rows.PARTITION
            keys = " or ".join(f"RowKey eq @k{i}" for i in range(len(chunk)))
            filter_ = f"PartitionKey eq @p and ( {keys} )"  # spaces: the SDK substitutes @names word by word
            rows_found = self.store.query_with_etags(TABLE, filter_, params)
            found = {e["VmName"]: (e["VmId"], etag) for e, etag in rows_found}
            self.reads += 1
            for name in chunk:
                self.names[name] = found.get(name, ("", None))

    def bound_vm(self, name: str) -> str:
        """The vmId bound to `name` ('' when unbound); load_names first."""
        return self.names.get(name, ("", None))[0]

    def vms_by_name(self, names: Iterable[str]) -> Dict[str, VmState]:
        """The current rows of the VMs with these names, read now (liveness any instance saw). Two VMs
        with one name: the one heard from last."""
        wanted = sorted(set(names))
        out: Dict[str, VmState] = {}
        for name in wanted:
            self.named.pop(name, None)
        for chunk in chunks(wanted, KEYS_PER_QUERY):
            params = {f"n{i}": n for i, n in enumerate(chunk)}
            params["p"] = rows.PARTITION
            # spaces around the parentheses: the SDK substitutes @names word by word
            filter_ = (
                "PartitionKey eq @p and Kind eq 'vm' and ( "
                + " or ".join(f"VmName eq @n{i}" for i in range(len(chunk)))
                + " )"
            )
            for entity, etag in self.store.query_with_etags(TABLE, filter_, params):
                vm = rows.vm_from_entity(entity)
                self.vms[vm.vm_id] = (vm, etag)
                if not vm.name_bound:
                    continue  # its name was taken over by the VM that holds it now
                have = out.get(vm.name)
                if have is None or (vm.last_seen or NEVER) > (have.last_seen or NEVER):
                    out[vm.name] = vm
            self.reads += 1
        self.named.update(out)
        return out

    def all_vms(self) -> List[VmState]:
        found = self.store.query_with_etags(
            TABLE, "PartitionKey eq @p and Kind eq 'vm'", {"p": rows.PARTITION}
        )
        self.reads += 1
        for entity, etag in found:
            vm = rows.vm_from_entity(entity)
            self.vms[vm.vm_id] = (vm, etag)
        return [rows.vm_from_entity(e) for e, _ in found]
