"""Telemetry: what central tells Azure Monitor, OpenTelemetry metrics with bounded attributes and one
`se.*` log marker per fact (infra/app/workbook.bicep and the alert rules read them: the names are a
contract, docs/central.md lists them). Calls are cheap no-ops until `metrics.configure(...)`.

May import: nothing of central.
Must never be imported by: central.model, central.policy, central.store (they stay free of side
effects); intake and runtime record through it.
"""
