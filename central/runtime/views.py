"""The operator's reads, answered from the shared state on any instance (one head read, and the
active events only when the head moved): pending events, one event, health."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Dict, List, Optional

from azure.core.exceptions import AzureError

from central.model.events import EventRecord, in_order_of_first_sight
from central.model.times import aware, iso
from central.policy.document import Policy
from central.store.fleet_state import FleetState
from central.store.log_rows import day
from central.store.tables import StoreError, TableLog, safe_key

from .results import UnknownEvent
from .settings import CentralSettings


def pending(state: FleetState) -> List[Dict[str, Any]]:
    """Events not ended, oldest first, with status, state, decision and current leader."""
    state.refresh()
    return [rec.view() for rec in in_order_of_first_sight(r for r, _ in state.active.values() if not r.ended)]


HISTORY_LIMIT = 500  # decision and result rows shown for one event


def event(state: FleetState, event_id: str, now: datetime) -> Dict[str, Any]:
    """One event, open or ended (any time ago; the id in any case), with its decision history: every
    Decisions row (decisions, approval results, shadow verdicts), oldest first."""
    state.refresh()
    rec, _ = state.find_event_any_case(event_id)
    if rec is None:
        raise UnknownEvent(f"no event {event_id!r} is known to central")
    view = rec.view()
    view["decisions"] = history(state.store, rec, now)
    view["alerts"] = alerts(state.store, rec, now)
    return view


def alerts(store: TableLog, rec: EventRecord, now: datetime) -> List[Dict[str, Any]]:
    """The alerts sent about the event (Alerts rows naming it), oldest first: what the on-call person got."""
    last = (rec.ended_at or now) + timedelta(days=1)
    found = store.query("Alerts", "PartitionKey ge @d0 and PartitionKey le @d1 and EventId eq @e",
                        {"d0": day(rec.first_seen - timedelta(days=1)), "d1": day(last), "e": rec.event_id})
    rows = sorted(found, key=lambda r: (str(r.get("At")), r["RowKey"]))
    return [{"at": iso(aware(r["At"])) if isinstance(r.get("At"), datetime) else r.get("At"),
             "kind": r.get("Kind"), "severity": r.get("Severity"), "title": r.get("Title"),
             "status": r.get("Status") or None, "outcome": r.get("Outcome")} for r in rows[:HISTORY_LIMIT]]


def history(store: TableLog, rec: EventRecord, now: datetime) -> List[Dict[str, Any]]:
    last = (rec.ended_at or now) + timedelta(days=1)  # a result is logged on the VM's day: one more
    found = store.query(
        "Decisions",
        "PartitionKey ge @d0 and PartitionKey le @d1 and RowKey ge @lo and RowKey lt @hi",
        {"d0": day(rec.first_seen - timedelta(days=1)), "d1": day(last),
         "lo": safe_key(rec.event_id + "_"), "hi": safe_key(rec.event_id + "`")},
    )
    rows = sorted((r for r in found if r.get("EventId") == rec.event_id), key=lambda r: (str(r.get("At")),
                                                                                         r["RowKey"]))
    return [
        {
            "at": iso(aware(r["At"])) if isinstance(r.get("At"), datetime) else r.get("At"),
            "action": r.get("Action"),
            "state": r.get("State"),
            "rule": r.get("Rule"),
            "reason": r.get("Reason"),
            "severity": r.get("Severity"),
            "decidedBy": r.get("DecidedBy"),
            "leaderVmName": r.get("LeaderVmName") or None,
            "messageId": r.get("MessageId") or None,
            "shadow": bool(r.get("Shadow")),
        }
        for r in rows[:HISTORY_LIMIT]
    ]


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
    shadow: Optional[Dict[str, Any]] = None,
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
        "shadowPolicy": shadow,  # None: no shadow policy configured
    }


def fleet(state: FleetState, policy: Policy, settings: CentralSettings, now: datetime) -> Dict[str, Any]:
    """Every VM central knows, silent ones first: identity, budget groups, last heard, outbox backlog and
    drops, forwarder version, open events naming it. From the shared state: any instance answers the same."""
    state.refresh()
    liveness = timedelta(seconds=settings.liveness)
    open_by_vm: Dict[str, List[str]] = {}
    states: Dict[str, str] = {}
    said: Dict[str, Dict[str, Dict[str, Any]]] = {}  # VM name -> event -> which witness said so
    for rec, _ in sorted(state.active.values(), key=lambda r: r[0].event_id):
        if not rec.ended:
            states[rec.event_id] = rec.state  # the same state names as the event view
            for name in rec.resources:
                open_by_vm.setdefault(name, []).append(rec.event_id)
                said.setdefault(name, {})[rec.event_id] = {"platform": rec.platform.get("said"),
                                                           "self": name in rec.reported_by}
    vms = []
    for vm in state.all_vms():
        live = vm.live(now, liveness)
        vms.append({
            "vmId": vm.vm_id,
            "name": vm.name,
            "scaleSet": vm.scale_set or None,
            "zone": vm.zone or None,
            "groups": sorted(g for g in (b.group_of(vm) for b in policy.budgets.values()) if g),
            "lastSeen": iso(vm.last_seen) if vm.last_seen else None,
            "lastHeartbeat": iso(vm.last_heartbeat) if vm.last_heartbeat else None,
            "outboxBacklog": vm.outbox_backlog,
            "outboxDropped": vm.outbox_dropped,
            "forwarderVersion": vm.forwarder_version or None,
            "openEvents": open_by_vm.get(vm.name, []) if vm.name_bound else [],
            "openEventStates": {e: states[e] for e in open_by_vm.get(vm.name, [])} if vm.name_bound else {},
            "witnesses": said.get(vm.name, {}) if vm.name_bound else {},
            "silent": not live,
            "nameBound": vm.name_bound,
        })
    vms.sort(key=lambda v: (not v["silent"], v["name"], v["vmId"]))
    silent = sum(1 for v in vms if v["silent"])
    return {"at": iso(now), "livenessSeconds": settings.liveness, "knownVms": len(vms),
            "liveVms": len(vms) - silent, "silentVms": silent, "authnMode": settings.authn_mode, "vms": vms}
