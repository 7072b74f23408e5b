"""Model: the plain records every stage of central shares, and time parsing. Pure: no I/O.

- times:    IMDS and ISO 8601 times, bounded to what Azure Tables can hold
- vms:      what central knows of a VM (identity, grouping, liveness, latest document)
- events:   one record per EventId across the VMs that report it (status only moves forward)
- alert:    an alert as it is owed, kept and delivered
- envelope: a schema-valid envelope or a bad one (parsing is central.intake.parse's)

May import: nothing of central (schemas/ and the standard library only).
Must never import it back: it is imported by every other package, and imports none of them.
"""
