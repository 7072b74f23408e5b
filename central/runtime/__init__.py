"""Runtime: central as it runs in the Function app, the only package with side effects on Azure.

It wires the stages for each call: intake (parse, authenticate, authorize, plan) -> commit to the
store -> the pure policy decides -> act (approval messages to the VMs' queues, alerts to the webhook)
-> log rows flushed; plus the operator's reads (views) and decisions (operator_desk), and the app
settings. `service.CentralService` is the one object that wires them.

May import: central.model, central.policy, central.store, central.intake, central.telemetry, schemas.
Must never be imported by: model, policy, store, intake, telemetry or cli (tools/import_layers.py).

Public face, the only names function_app.py uses (imported on first use, so indexing the app stays
cheap): `CentralService`, `configure_metrics` (Application Insights), `properties_of` (the Event
Hubs application properties that sender authentication reads), and the operator API's callers
(`operator_access`): `signed_in` (a principal the platform vouched for, with a role) and `named_key` (the
automation route's named function key); and the two refusals an operator call can meet, `UnknownEvent`
(404) and `InvalidRequest` (409), so that any other error stays an error; and `console_asset` (the on-call
console's files, central/runtime/console.py).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CentralService", "InvalidRequest", "UnknownEvent", "configure_metrics", "console_asset",
           "named_key",
           "properties_of", "signed_in"]


def __getattr__(name: str) -> Any:
    if name == "CentralService":
        from .service import CentralService

        return CentralService
    if name == "configure_metrics":
        from central.telemetry.metrics import configure

        return configure
    if name in ("InvalidRequest", "UnknownEvent"):
        from . import results

        return getattr(results, name)
    if name == "properties_of":
        from central.intake.sender import properties_of

        return properties_of
    if name == "console_asset":
        from .console import asset

        return asset
    if name in ("signed_in", "named_key"):
        from . import operator_access

        return getattr(operator_access, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
