"""The State table's rows read by key (VM and name rows, and any kinds mixed in one query: `read_rows`), into
FleetState's cache (a mixin of central.store.fleet_state)."""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Set, Tuple

from central.model.vms import VmState
from central.store import state_rows as rows

from .active_events import ActiveEvents
from .tables import TableLog

TABLE = "State"
KEYS_PER_QUERY = 14  # Azure Tables: at most 15 comparisons in one filter
Found = Dict[str, Tuple[dict, Optional[str]]]  # RowKey -> (entity, etag): what read_rows returns


def chunks(items: List[str], size: int) -> Iterable[List[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class VmReads:
    store: TableLog
    vms: Dict[str, Tuple[VmState, Optional[str]]]  # vmId -> (state, etag)
    names: Dict[str, Tuple[str, Optional[str]]]  # VM name -> (bound vmId, etag); read ones
    named: Dict[str, VmState]  # VM name -> the row of the VM holding it, as last read or written (cache_vm)
    active: ActiveEvents  # FleetState's cached active events
    reads: int

    def vm(self, vm_id: str) -> Optional[VmState]:
        found = self.vms.get(vm_id)
        return found[0] if found else None

    def read_rows(self, keys: Iterable[str]) -> Found:
        """State rows by RowKey, any kinds mixed, 14 keys per query: RowKey -> (entity, etag) for those found.
        One query for most callers, whatever the kinds (they share the fleet's partition)."""
        found: Found = {}
        for chunk in chunks(sorted(set(keys)), KEYS_PER_QUERY):
            params = {f"k{i}": k for i, k in enumerate(chunk)}
            params["p"] = rows.PARTITION
            where = " or ".join(f"RowKey eq @k{i}" for i in range(len(chunk)))
            # spaces around the keys: the SDK substitutes @names word by word
            query = f"PartitionKey eq @p and ( {where} )"
            for entity, etag in self.store.query_with_etags(TABLE, query, params):
                found[entity["RowKey"]] = (entity, etag)
            self.reads += 1
        return found

    def load_vms(self, vm_ids: Iterable[str], force: bool = False) -> None:
        """Read the VM rows not cached (or all of them, `force`)."""
        wanted = {v for v in vm_ids if force or v not in self.vms}
        self.install_vms(wanted, self.read_rows(rows.vm_key(v) for v in wanted))

    def cache_vm(self, vm_id: str, vm: Optional[VmState], etag: Optional[str]) -> None:
        """Cache a VM's row as just read or committed (None: it has none). A row bound to its name is that
        name's holder now (a name moves only in the transaction that marks its old holder's row unbound,
        central.intake.plan), so it is also cached as the holder (`named`: what a pass takes without a read
        where reusable, central.runtime.vm_facts); a row no longer bound stops being one."""
        before = self.vms.pop(vm_id, None)
        for name in {row.name for row in (before[0] if before else None, vm) if row is not None}:
            held = self.named.get(name)
            if held is not None and held.vm_id == vm_id:
                del self.named[name]
        if vm is not None:
            self.vms[vm_id] = (vm, etag)
            if vm.name_bound:
                self.named[vm.name] = vm

    def install_vms(self, vm_ids: Iterable[str], found: Found) -> None:
        """Cache these VMs' rows as `found` holds them (read_rows): a VM with none is not cached."""
        for vm_id in vm_ids:
            got = found.get(rows.vm_key(vm_id))
            self.cache_vm(vm_id, rows.vm_from_entity(got[0]) if got is not None else None,
                          got[1] if got is not None else None)

    def load_names(self, names: Iterable[str], force: bool = False) -> None:
        """Read the name bindings not cached (or all, `force`); an unbound name is cached as ("", None)."""
        wanted = {n for n in names if force or n not in self.names}
        self.install_names(wanted, self.read_rows(rows.name_key(n) for n in wanted))

    def install_names(self, names: Iterable[str], found: Found) -> None:
        for name in names:
            got = found.get(rows.name_key(name))
            self.names[name] = (got[0]["VmId"], got[1]) if got is not None else ("", None)

    def bound_vm(self, name: str) -> str:
        """The vmId bound to `name` ('' when unbound); load_names first."""
        return self.names.get(name, ("", None))[0]

    def name_hints(self, names: Set[str]) -> Dict[str, str]:
        """The vmIds that reported events this instance cached under these names: likely holders, known
        without a read (vms_by_name checks each on its VM row). Kept as events are cached, not found by
        scanning the active events on every read (thousands in a 100k wave)."""
        reporters = self.active.reporters  # (central.store.active_events keeps them)
        return {name: reporters[name] for name in names if name in reporters}

    def vms_by_name(self, names: Iterable[str]) -> Dict[str, VmState]:
        """The current rows of the VMs holding these names, read now (liveness any instance saw), by key:
        a VM row (or a name row) is a point read, where a filter on VmName would scan every VM row of the
        fleet's partition on each call (100,000 rows at 100k VMs). A cached name binding is checked on its
        VM's row: a name moves only in the transaction that marks its old holder's row unbound
        (central.intake.plan), so a row still bound to the name is its holder now. Other names: their name
        rows, then the rows of the VMs bound to them. A name no binding is cached for is first tried on the VM
        a cached event says reported under it (`name_hints`): on 4 instances most names a pass reads are of
        VMs another instance heard, and their name rows were a read of their own."""
        wanted = sorted(set(names))
        for name in wanted:
            self.named.pop(name, None)
        cached = {n: self.names[n][0] for n in wanted if self.names.get(n, ("", None))[0]}
        cached.update(self.name_hints(set(wanted) - set(cached)))
        self.load_vms(set(cached.values()), force=True)
        out: Dict[str, VmState] = {}
        unsure: List[str] = []
        for name in wanted:
            vm = self.vm(cached.get(name, ""))
            if vm is not None and vm.name_bound and vm.name == name:
                out[name] = vm
            else:
                unsure.append(name)
        if unsure:
            self.load_names(unsure, force=True)
            holders = {n: self.bound_vm(n) for n in unsure}
            self.load_vms([v for v in holders.values() if v], force=True)
            for name, vm_id in holders.items():
                vm = self.vm(vm_id) if vm_id else None
                if vm is not None and vm.name_bound and vm.name == name:
                    out[name] = vm
        return out  # (and cached as the names' holders: cache_vm)

    def all_vms(self) -> List[VmState]:
        found = self.store.query_with_etags(
            TABLE, "PartitionKey eq @p and Kind eq 'vm'", {"p": rows.PARTITION}
        )
        self.reads += 1
        for entity, etag in found:
            vm = rows.vm_from_entity(entity)
            self.cache_vm(vm.vm_id, vm, etag)
        return [rows.vm_from_entity(e) for e, _ in found]
