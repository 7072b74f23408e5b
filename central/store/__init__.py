"""Store: Azure Table storage, the only truth central has (docs/central.md, "Log store").

- tables:      the Tables client: conditional transactions on the State table, staged log writes
- batch_wire:  one entity-group transaction written on the wire (the only use of SDK internals)
- int64:       integers as Azure Tables holds them (Int32 by default, Int64 when wider)
- state_rows:  records <-> State table rows (head, vm:, o:, x:, a:, n:)
- log_rows:    the log tables' rows (Incarnations, Quarantine, Decisions, Alerts) analytics reads
- fleet_state: the fleet's shared state and this instance's ETag-checked cache of it

May import: central.model, schemas.
Must never be imported by: central.model, central.policy (the policy stays free of storage types).
"""
