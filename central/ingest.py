"""Ingest: envelopes -> state changes in the store (the State table), plus their log rows.

One-way: parse and check every body (schema, store limits, the sender gate), then plan the changes
on copies of the cached rows and commit them under the store's concurrency control. Planning is
redone from re-read rows whenever a commit loses a race, so the cache can never make a change wrong.
Envelopes are committed in segments of at most ~95 operations (one transaction each, all or nothing);
an envelope whose rows the store refuses is set aside and quarantined, never retried forever.

Liveness and ordering use central's clock: the time the hub enqueued the envelope (or, without one,
when central received it), never the VM's own `time`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple, Union

from . import authz, ingest_alerts, limits, logrows, metrics
from . import envelopes as env_mod
from .alerts import Alert
from .envelopes import BadEnvelope, Envelope
from .ingest_alerts import owe_status_alert
from .registry import EventRecord
from .results import BatchResult
from .state import Changes, FleetState
from .store import Conflict, Rejected, StoreError, TableLog
from .timeutil import iso
from .vms import VmState

log = logging.getLogger(__name__)
_UNBOUND = VmState("", "", name_bound=False)

SEGMENT_OPS = 100  # operations per State transaction (the service's limit)
MAX_TRIES = 8  # plans per segment before a lost race counts as a (transient) store error
RAISED_LIMIT = 10_000
HEARTBEAT_LOG_EVERY = 300  # seconds between two `se.heartbeat` log markers of one VM (see below)

# The sender check (central.sender.SenderAuth.check): called with each schema-valid envelope's claimed
# vmId, its raw body, its Event Hubs application properties and central's receive time before anything
# is applied; returns "" to accept or the reason to quarantine it.
Gate = Callable[[str, Union[bytes, str], Optional[Mapping[Any, Any]], datetime], str]


def accept_all(vm_id: str, body: Union[bytes, str], properties: Optional[Mapping[Any, Any]],
               received: datetime) -> str:
    return ""


@dataclass
class Item:
    """One body of the batch, parsed, with central's receive time."""

    parsed: Union[Envelope, BadEnvelope]
    received: datetime


@dataclass
class Plan:
    changes: Changes = field(default_factory=Changes)
    log_rows: List[tuple] = field(default_factory=list)  # (table, entity) staged after the commit
    touched: Set[str] = field(default_factory=set)  # events to decide about after the commit
    markers: List[Tuple[int, str, tuple]] = field(default_factory=list)  # (level, format, args), after commit
    owed: Set[str] = field(default_factory=set)  # keys of the event alerts this plan makes owed
    refusals: List[Dict[str, str]] = field(default_factory=list)  # the current envelope's, see _refuse
    counts: Dict[str, int] = field(default_factory=dict)

    def count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1


def parse(
    body: Union[bytes, str], received: datetime, gate: Gate, properties: Optional[Mapping[Any, Any]] = None
) -> Item:
    """A body -> Envelope, or BadEnvelope (schema, store limits, or the sender check refused it)."""
    item = env_mod.parse_body(body)
    if isinstance(item, Envelope):
        problems = limits.envelope_problems(item.type, item.data)
        problems += [
            {"path": "/", "message": m} for m in (limits.text_problem(env_mod._text(body), item.raw),) if m
        ]
        reason = "" if problems else gate(item.vm_id, body, properties, received)
        if reason:
            problems.append({"path": "/", "message": f"refused by the sender check: {reason}"[:300]})
        if problems:
            item = bad_from(body, problems, item)
    return Item(item, received)


def bad_from(
    body: Union[bytes, str], errors: List[Dict[str, str]], env: Optional[Envelope] = None
) -> BadEnvelope:
    text = env_mod._text(body)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return BadEnvelope(
        text, errors, digest, vm_id=env.vm_id if env else None, envelope_id=env.id if env else None
    )


class Ingest:
    def __init__(self, state: FleetState, logs: TableLog) -> None:
        self.state = state
        self.logs = logs
        # alert keys of envelope-level alerts raised lately: a replayed bad body is not alerted again
        # (a cache: suppressing a repeat of an alert already owed or delivered loses nothing)
        self.raised: OrderedDict[str, None] = OrderedDict()
        self.owed: Set[str] = set()  # event alert keys committed by this call (delivered at once)
        self.rows_owed: List[Alert] = []  # alerts owed by no event committed by this call

    # ---- segments and the commit loop ---------------------------------------------------------
    def apply(self, items: List[Item], now: datetime, result: BatchResult) -> Set[str]:
        """Commit every item; returns the events to decide about. Raises StoreError only for storage
        failures (nothing of the failed segment was written: the batch can be retried whole)."""
        touched: Set[str] = set()
        segment: List[Item] = []
        vms: Set[str] = set()
        ops = 0
        for item in items:
            cost = self._cost(item, set(vms))
            if segment and ops + cost > SEGMENT_OPS:
                touched |= self._commit_segment(segment, now, result)
                segment, ops, vms = [], 0, set()
                cost = self._cost(item, set())
            segment.append(item)
            if isinstance(item.parsed, Envelope):
                vms.add(item.parsed.vm_id)
            ops += cost
        if segment:
            touched |= self._commit_segment(segment, now, result)
        return touched

    def _cost(self, item: Item, vms: Set[str]) -> int:
        """An upper bound of the operations `item` adds to a segment whose VMs are `vms` (the head
        counted once per envelope that may change events)."""
        env = item.parsed
        if isinstance(env, BadEnvelope):
            return 1  # its alert row
        row = 0 if env.vm_id in vms else 1
        vms.add(env.vm_id)
        vm = self.state.vm(env.vm_id)
        if env.type == env_mod.HEARTBEAT:  # (and its outbox-drop alert, when the counter went up)
            dropped = (env.data.get("outbox") or {}).get("dropped", 0)
            return row + (1 if vm is None or dropped > vm.outbox_dropped else 0)
        if env.type == env_mod.QUARANTINED:
            return row + 1
        if env.type == env_mod.APPROVAL_RESULT:
            return row + 3  # the event (may move o: -> x:) and the head
        listed = len(vm.listed) if vm else 0
        events = len((env.data.get("document") or {}).get("Events") or [])
        return row + (2 * (events + listed) + 1 if events + listed else 0)

    def _commit_segment(self, segment: List[Item], now: datetime, result: BatchResult) -> Set[str]:
        for _ in range(MAX_TRIES):
            self._prepare(segment)
            plan = self._plan(segment, now)
            try:
                seq = self.state.commit(plan.changes, now)
            except Conflict as exc:
                result.conflicts += 1
                log.info("ingest lost a race (%s): re-reading and planning again", exc)
                self.state.refresh()
                self.state.load_vms(plan.changes.vms, force=True)
                self.state.load_names(plan.changes.names, force=True)
                continue
            except Rejected as exc:
                if len(segment) > 1:  # find the envelope the store refuses: one at a time
                    touched: Set[str] = set()
                    for item in segment:
                        touched |= self._commit_segment([item], now, result)
                    return touched
                return self._set_aside(segment[0], str(exc), now, result)
            result.transactions += 1 if not plan.changes.empty() else 0
            self._after(plan, seq, now, result)
            return plan.touched
        raise StoreError(f"ingest: still losing races after {MAX_TRIES} re-reads (contention)")

    def _set_aside(self, item: Item, why: str, now: datetime, result: BatchResult) -> Set[str]:
        """The store refuses this envelope's rows: quarantine it (kept whole, alerted) and go on."""
        body = item.parsed.raw if isinstance(item.parsed, Envelope) else None
        text = json.dumps(body) if body is not None else getattr(item.parsed, "text", "")
        bad = bad_from(
            text,
            [{"path": "/", "message": f"the log store refused its rows: {why}"[:300]}],
            item.parsed if isinstance(item.parsed, Envelope) else None,
        )
        log.error("envelope set aside: the store refuses its rows: %s", why)
        return self._commit_segment([Item(bad, item.received)], now, result)

    def _prepare(self, segment: List[Item]) -> None:
        """Read what planning needs and the cache lacks: unknown VMs; events when any may change."""
        envs = [i.parsed for i in segment if isinstance(i.parsed, Envelope)]
        self.state.load_vms([e.vm_id for e in envs if self.state.vm(e.vm_id) is None])
        unbound = [e.vm_name for e in envs if not (self.state.vm(e.vm_id) or _UNBOUND).name_bound]
        if unbound:  # a VM seen for the first time (or one that lost its name): who holds its name?
            self.state.load_names(unbound)
            holders = [self.state.bound_vm(n) for n in unbound]
            self.state.load_vms([h for h in holders if h and self.state.vm(h) is None])
        if any(
            isinstance(i.parsed, Envelope) and i.parsed.type in (env_mod.INCARNATION, env_mod.APPROVAL_RESULT)
            for i in segment
        ):
            self.state.ensure_loaded()

    def _after(self, plan: Plan, seq: int, now: datetime, result: BatchResult) -> None:
        self.owed |= plan.owed
        self.rows_owed += plan.changes.alerts
        for alert in plan.changes.alerts:
            self.raised[alert.key] = None
            while len(self.raised) > RAISED_LIMIT:
                self.raised.popitem(last=False)
        for table, entity in plan.log_rows:
            self.logs.stage(table, entity)
        for level, fmt, args in plan.markers:
            log.log(level, fmt, *args)
        for name, n in plan.counts.items():
            setattr(result, name, getattr(result, name) + n)

    # ---- planning (on copies; nothing is written here) ------------------------------------------
    def _plan(self, segment: List[Item], now: datetime) -> Plan:
        plan = Plan()
        for item in segment:
            env = item.parsed
            if isinstance(env, BadEnvelope):
                self._quarantine(plan, env, now)
                continue
            problem = self._identity(plan, env, item.received)
            if problem:  # the envelope cannot speak as this VM: nothing of it is applied
                plan.refusals.append({"path": "/data/vm", "message": problem})
                self._refuse(plan, env, now)
                continue
            plan.count("processed")
            vm = self._vm(plan, env, item.received)
            if env.type == env_mod.INCARNATION:
                self._incarnation(plan, env, vm, item.received, now)
            elif env.type == env_mod.HEARTBEAT:
                self._heartbeat(plan, env, vm, item.received, now)
            elif env.type == env_mod.QUARANTINED:
                self._forwarder_quarantine(plan, env, now)
            elif env.type == env_mod.APPROVAL_RESULT:
                self._approval_result(plan, env, now)
            if plan.refusals:
                self._refuse(plan, env, now)
        fresh: Dict[str, Alert] = {}
        for alert in plan.changes.alerts:  # one row per key (a transaction touches an entity once)
            if alert.key not in self.raised:
                fresh.setdefault(alert.key, alert)
        plan.changes.alerts = list(fresh.values())
        return plan

    def _identity(self, plan: Plan, env: Envelope, received: datetime) -> str:
        """'' when `env` may speak as its VM, binding a new VM's name to its vmId (or moving the name of a
        VM silent for authz.NAME_RELEASE); else why not (central.authz)."""
        vm = plan.changes.vms.get(env.vm_id) or self.state.vm(env.vm_id)
        if vm is not None:
            conflicts = vm.identity_conflicts(env.vm)
            if conflicts:
                return f"vmId {env.vm_id} is bound to other facts: " + "; ".join(
                    f"{k} {v}" for k, v in sorted(conflicts.items())
                )
            if vm.name_bound:
                return ""
        name = env.vm_name
        holder = plan.changes.names.get(name) or self.state.bound_vm(name)
        if holder == env.vm_id:
            return ""
        if holder:
            other = plan.changes.vms.get(holder) or self.state.vm(holder)
            silent_since = other.last_seen if other is not None else None
            if silent_since is not None and received - silent_since <= authz.NAME_RELEASE:
                return (f"the name {name!r} is bound to vmId {holder}, heard from at {iso(silent_since)}; "
                        f"another vmId may take it only after {authz.NAME_RELEASE} of silence")
            if other is not None:
                moved = dataclasses.replace(other, name_bound=False, listed=list(other.listed))
                plan.changes.vms[holder] = moved
            plan.markers.append((logging.WARNING, "the name %s moves from silent vmId %s to vmId %s",
                                 (name, holder, env.vm_id)))
        plan.changes.names[name] = env.vm_id
        return ""

    def _vm(self, plan: Plan, env: Envelope, received: datetime) -> VmState:
        vm = plan.changes.vms.get(env.vm_id)
        if vm is None:
            cached = self.state.vm(env.vm_id)
            if cached:
                vm = dataclasses.replace(cached, tags=dict(cached.tags), listed=list(cached.listed))
            else:
                vm = VmState(env.vm_id, env.vm_name)
                vm.bind_identity(env.vm)
            plan.changes.vms[env.vm_id] = vm
        if plan.changes.names.get(vm.name) == vm.vm_id:
            vm.name_bound = True
        vm.update_tags(env.vm)
        vm.seen(received)
        return vm

    def _event(self, plan: Plan, event_id: str) -> tuple:
        """(working copy, active) of a known event, or (None, False) for a new one."""
        if event_id in plan.changes.events:
            return plan.changes.events[event_id], True
        rec, active = self.state.find_event(event_id)
        if rec is None or not active:
            return rec, False
        mine = copy.deepcopy(rec)
        plan.changes.events[event_id] = mine
        return mine, True

    def _incarnation(self, plan: Plan, env: Envelope, vm: VmState, received: datetime, now: datetime) -> None:
        inc = env.data["incarnation"]
        replay = vm.incarnation == inc and vm.applied_envelope == env.id
        applied = not replay and (
            vm.incarnation is None
            or inc > vm.incarnation
            or (
                bool(env.data.get("reset"))
                and vm.incarnation_observed is not None
                and received > vm.incarnation_observed
            )
        )
        plan.log_rows.append(("Incarnations", logrows.incarnation_entity(env, applied or replay, now)))
        if not applied:  # older, or this very one again (replayed after a crash): changes nothing
            plan.count("stale")
            return
        listed: List[str] = []
        for i, event in enumerate((env.data.get("document") or {}).get("Events") or []):
            event_id = event["EventId"]
            if not authz.names_reporter(event, vm.name):
                continue  # a sibling's event (same availability set): the VMs it names report it
            rec, active = self._event(plan, event_id)
            if rec is not None and not active:
                plan.count("late")  # ended before: recognised, never revived
                log.info("late report of ended event %s (%s) from %s", event_id, rec.status, vm.name)
                continue
            conflicts = authz.fact_conflicts(rec, event) if rec is not None else []
            if conflicts:
                path = f"/data/document/Events/{i}"
                plan.refusals += [{"path": path, "message": f"{event_id}: {c}"} for c in conflicts]
                if event_id in vm.listed:
                    listed.append(event_id)  # as before: a refused report neither adds nor removes
                continue
            if rec is None and not vm.count_new_event(received, limits.NEW_EVENTS_PER_HOUR):
                too_many = f"{event_id}: {vm.name} brought {limits.NEW_EVENTS_PER_HOUR} new events this hour"
                plan.refusals.append({"path": f"/data/document/Events/{i}", "message": too_many})
                continue
            listed.append(event_id)
            if rec is None:
                rec = EventRecord(event_id=event_id, first_seen=received)
                plan.changes.events[event_id] = rec
            if rec.absorb(event, vm.vm_id, vm.name, received):
                out = rec.outstanding
                if rec.status == "Started" and out is not None:
                    out.result, out.result_at = "event-started", now  # nothing is outstanding any more
                plan.owed.add(owe_status_alert(rec, now))
            plan.touched.add(event_id)  # a new reporter may be the live leader it waited for
        for event_id in vm.listed:
            if event_id in listed:
                continue
            rec, active = self._event(plan, event_id)
            if rec is None or not active:
                continue
            if rec.unlisted_by(vm.vm_id, received):
                plan.owed.add(owe_status_alert(rec, now))
        vm.incarnation = inc
        vm.incarnation_observed = received
        vm.applied_envelope = env.id[:512]
        vm.listed = listed

    def _heartbeat(self, plan: Plan, env: Envelope, vm: VmState, received: datetime, now: datetime) -> None:
        outbox = env.data.get("outbox") or {}
        if vm.last_heartbeat is None or received >= vm.last_heartbeat:  # an older heartbeat changes nothing
            vm.last_heartbeat = received
            vm.outbox_backlog = int(outbox.get("backlog", 0))
            vm.forwarder_version = str(
                (env.data.get("forwarder") or {}).get("version", vm.forwarder_version)
            )[:64]
        # One `se.heartbeat` line per VM per HEARTBEAT_LOG_EVERY: the Azure Monitor "heartbeats missing"
        # alert (infra/app/alerts.bicep) reads it; throttled so a fleet does not flood the logs.
        if vm.heartbeat_logged is None or (now - vm.heartbeat_logged).total_seconds() >= HEARTBEAT_LOG_EVERY:
            vm.heartbeat_logged = now
            plan.markers.append(
                (logging.INFO, metrics.HEARTBEAT_MARKER, (vm.vm_id, vm.name, vm.outbox_backlog))
            )
        dropped = int(outbox.get("dropped", 0))
        if dropped > vm.outbox_dropped:
            # Marker for the Azure Monitor "outbox drops" log alert (infra/app/alerts.bicep).
            plan.markers.append(
                (
                    logging.WARNING,
                    metrics.OUTBOX_DROPPED_MARKER,
                    (vm.vm_id, vm.name, dropped, vm.outbox_dropped),
                )
            )
            plan.changes.alerts.append(ingest_alerts.outbox_dropped(vm, dropped, outbox, now))
            vm.outbox_dropped = dropped

    def _quarantine(self, plan: Plan, bad: BadEnvelope, now: datetime) -> None:
        plan.count("quarantined")
        plan.log_rows.append(("Quarantine", logrows.quarantine_central(bad, now)))
        plan.changes.alerts.append(ingest_alerts.quarantined(bad, now))

    def _forwarder_quarantine(self, plan: Plan, env: Envelope, now: datetime) -> None:
        plan.count("quarantined")
        entity = logrows.quarantine_forwarder(env, now)
        plan.log_rows.append(("Quarantine", entity))
        plan.changes.alerts.append(ingest_alerts.forwarder_quarantined(env, entity["Sha256"], now))

    def _refuse(self, plan: Plan, env: Envelope, now: datetime) -> None:
        """What this envelope said that its VM may not say: kept whole in Quarantine, alerted, never
        applied (the rest of the envelope was)."""
        problems, plan.refusals = plan.refusals[:20], []
        bad = bad_from(json.dumps(env.raw), problems, env)
        plan.count("refused")
        plan.log_rows.append(("Quarantine", logrows.quarantine_central(bad, now)))
        plan.changes.alerts.append(ingest_alerts.refused(env, problems, bad.sha256, now))
        log.warning("refused from %s (%s): %s", env.vm_name, env.vm_id, problems[0]["message"])

    def _approval_result(self, plan: Plan, env: Envelope, now: datetime) -> None:
        from .outcomes import apply_result  # the result's effect on the event (shared with replay tools)

        d = env.data
        rec, active = self._event(plan, d["eventId"])
        if rec is None or not active:
            plan.log_rows.append(("Decisions", logrows.result_entity(env, now)))
            log.warning("approval result for unknown or ended event %s from %s", d["eventId"], env.vm_name)
            return
        problem = authz.result_problem(rec, d, env.vm_id, env.vm_name)
        if problem:
            plan.refusals.append({"path": "/data", "message": problem})
            return
        plan.log_rows.append(("Decisions", logrows.result_entity(env, now)))
        decision = apply_result(rec, d, env.vm_name, now)
        if decision is not None:
            plan.owed.add(f"{rec.event_id}:approval-failed")
            plan.log_rows.append(
                (
                    "Decisions",
                    logrows.decision_entity(rec.event_id, rec.event_type, rec.decision_seq, decision, now),
                )
            )
            plan.touched.add(rec.event_id)
