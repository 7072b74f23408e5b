"""The operator's reads, answered from the shared state on any instance (one head read, and the
active events only when the head moved): pending events, one event, health."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Dict, List, Optional

from azure.core.exceptions import AzureError

from .policy import Policy
from .results import UnknownEvent
from .settings import CentralSettings
from .state import FleetState
from .store import StoreError


def pending(state: FleetState) -> List[Dict[str, Any]]:
    """Events not ended, oldest first, with status, state, decision and current leader."""
    state.refresh()
    return [
        rec.view()
        for rec, _ in sorted(state.active.values(), key=lambda r: (r[0].first_seen, r[0].event_id))
        if not rec.ended
    ]


def event(state: FleetState, event_id: str) -> Dict[str, Any]:
    """One event, open or ended (any time ago)."""
    state.refresh()
    rec, _ = state.find_event(event_id)
    if rec is None:
        raise UnknownEvent(f"no event {event_id!r} is known to central")
    return rec.view()


def health(
    state: FleetState,
    policy: Policy,
    policy_ok: bool,
    settings: CentralSettings,
    now: datetime,
    counters: Dict[str, int],
    staged: int,
    requests: Optional[int],
    sender: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    storage = "ok"
    known = live = 0
    open_events = owed = 0
    try:
        state.refresh()
        vms = state.all_vms()
        known = len(vms)
        live = sum(1 for v in vms if v.live(now, timedelta(seconds=settings.liveness)))
        open_events = sum(1 for rec, _ in state.active.values() if not rec.ended)
        owed = sum(len(rec.pending_alerts) for rec, _ in state.active.values())
    except (AzureError, StoreError) as exc:
        storage = f"error: {exc}"[:300]
    return {
        "status": "ok" if storage == "ok" and policy_ok else "degraded",
        "storage": storage,
        "policy": policy.describe(),
        "webhook": {"configured": bool(settings.webhook_url), "format": settings.webhook_format},
        "openEvents": open_events,
        "knownVms": known,
        "liveVms": live,
        "alertsOwed": owed,
        "stagedRows": staged,
        "counters": dict(counters),
        "storageRequests": requests,
        # off: any holder of the hub's send right can speak for any VM (docs/security.md)
        "senderAuthentication": sender or {"enabled": False},
    }
