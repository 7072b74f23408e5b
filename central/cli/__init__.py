"""The operators' command-line tools, shipped by ops/pyproject.toml (not on the VMs, not needed by the
Function app):

- se_policy:        `se-policy check | explain | whatif`
- se_fleet:         `se-fleet status` over the operator API
- explain:          which rule decides an event, and why (pure)
- whatif, whatif_command: replay recorded history through a candidate policy with the runtime's own
                    decide function
- history:          recorded history from a hub export or the log store

May import: central.model, central.policy, central.store, central.intake, schemas.
Must never be imported by: any other package of central (the runtime never depends on a tool).
"""
