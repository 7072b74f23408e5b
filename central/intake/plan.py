"""Planning: a segment of envelopes -> the state changes, log rows, alerts and log markers they cause,
made on copies of the cached rows; nothing is written here (central.runtime.ingest commits a plan, and plans
again from re-read rows when the commit loses a race). What a VM may say is central.intake.authz's; identity
(name binding) is checked first, then each envelope type is applied.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple, Union, cast

from central.intake import alerts as ingest_alerts
from central.intake import authz, downgrade
from central.intake import bounds as limits
from central.intake import parse as env_mod
from central.model.alert import Alert
from central.model.envelope import APPROVAL_RESULT, HEARTBEAT, INCARNATION, QUARANTINED, BadEnvelope, Envelope
from central.model.events import EventRecord, spellings
from central.model.times import iso
from central.model.vms import VmState
from central.policy.approval_results import apply_result  # a result's effect (shared with replays)
from central.policy.decide import DONE_OUTCOMES
from central.store import log_rows as logrows
from central.store.fleet_state import Changes, FleetState
from central.telemetry import metrics

from .alerts import owe_status_alert

log = logging.getLogger("central.ingest")  # one logger for ingest's lines (tests and the alerts read it)
HEARTBEAT_MISSING_MINUTES = 15.0  # infra/main.bicep heartbeatMissingMinutes's default (the app setting's)


def heartbeat_log_every(missing_minutes: float) -> float:
    """Seconds between two `se.heartbeat` markers of one VM (see _heartbeat): twice per window of the
    heartbeats-missing alert (no marker for HEARTBEAT_MISSING_MINUTES), so it never fires for a VM that
    beats (every 60 s by default: a marker is at most one heartbeat later than due)."""
    return missing_minutes * 60.0 / 2


HEARTBEAT_LOG_EVERY = heartbeat_log_every(HEARTBEAT_MISSING_MINUTES)  # 450 s
UNBOUND = VmState("", "", name_bound=False)


@dataclass
class Item:
    """One body of the batch, parsed, with central's receive time."""

    parsed: Union[Envelope, BadEnvelope]
    received: datetime
    # how the sender gate let it in: True signed, False unsigned on condition (preferred), None: off
    signed: Optional[bool] = None


def bad_from(
    body: Union[bytes, str], errors: List[Dict[str, str]], env: Optional[Envelope] = None,
    verified: bool = False,
) -> BadEnvelope:
    """`verified`: the sender check vouched for env's vmId (alerts may then be keyed by it)."""
    text = env_mod._text(body)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return BadEnvelope(
        text, errors, digest, vm_id=env.vm_id if env else None, envelope_id=env.id if env else None,
        verified=verified and env is not None,
    )


@dataclass
class Plan:
    changes: Changes = field(default_factory=Changes)
    log_rows: List[tuple] = field(default_factory=list)  # (table, entity) staged after the commit
    touched: Set[str] = field(default_factory=set)  # events to decide about after the commit
    markers: List[Tuple[int, str, tuple]] = field(default_factory=list)  # (level, format, args), after commit
    owed: Set[str] = field(default_factory=set)  # keys of the event alerts this plan makes owed
    refusals: List[Dict[str, str]] = field(default_factory=list)  # the current envelope's, see _refuse
    counts: Dict[str, int] = field(default_factory=dict)
    metrics: List[Callable[[], None]] = field(default_factory=list)  # metrics calls, made after the commit

    def count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def quarantined(self, origin: str, vm_id: str) -> None:
        """Counted and logged once the commit made it true; logged with the batch's other quarantines
        (metrics.quarantine_lines: a flood is a few records, not one per envelope)."""
        self.metrics.append(lambda: metrics.quarantine(origin))
        self.markers.append((logging.WARNING, metrics.QUARANTINE_MARKER, (origin, vm_id)))


class Planner:
    def __init__(self, state: FleetState, raised: Mapping[str, None],
                 heartbeat_log_every: float = HEARTBEAT_LOG_EVERY) -> None:
        self.state = state
        self.raised = raised  # alert keys raised lately (ingest's): not raised again
        self.heartbeat_log_every = heartbeat_log_every

    def plan(self, segment: List[Item], now: datetime) -> Plan:
        """The changes `segment` makes, planned on copies of the cached rows."""
        plan = Plan()
        for item in segment:
            env = item.parsed
            if isinstance(env, BadEnvelope):
                self._quarantine(plan, env, now)
                continue
            if self._downgrade(plan, item, now):
                continue
            problem = self._identity(plan, env, item.received)
            if problem:  # the envelope cannot speak as this VM: nothing of it is applied
                plan.refusals.append({"path": "/data/vm", "message": problem})
                self._refuse(plan, env, now)
                continue
            plan.count("processed")
            plan.metrics.append(lambda t=env.type: metrics.envelope(t))
            vm = self._vm(plan, env, item.received)
            vm.signed_at = downgrade.signed_since(item.signed, vm.signed_at, item.received)
            if item.signed:  # its resourceId's subscription is the attested one (central.intake.authn)
                vm.follow_subscription(env.vm.get("resourceId"))
            if env.type == INCARNATION:
                self._incarnation(plan, env, vm, item.received, now)
            elif env.type == HEARTBEAT:
                self._heartbeat(plan, env, vm, item.received, now)
            elif env.type == QUARANTINED:
                self._forwarder_quarantine(plan, env, now)
            elif env.type == APPROVAL_RESULT:
                self._approval_result(plan, env, now)
            if plan.refusals:
                self._refuse(plan, env, now)
        fresh: Dict[str, Alert] = {}
        for alert in plan.changes.alerts:  # one row per key (a transaction touches an entity once)
            if alert.key not in self.raised:
                fresh.setdefault(alert.key, alert)
        plan.changes.alerts = list(fresh.values())
        return plan

    def _downgrade(self, plan: Plan, item: Item, now: datetime) -> bool:
        """An unsigned envelope from a VM whose row says it has signed: quarantined as unverified (its
        alert keyed by no VM: central.intake.alerts) plus one `authn-downgrade` alert per window. True
        when refused. The row read is the one this plan commits under If-Match (central.intake.downgrade)."""
        env = cast(Envelope, item.parsed)
        vm = plan.changes.vms.get(env.vm_id) or self.state.vm(env.vm_id)
        why = downgrade.refusal(item.signed, vm.signed_at if vm else None, env.vm_id)
        if not why:
            return False
        problem = {"path": "/", "message": f"refused by the sender check: {why}"[:300]}
        bad = bad_from(json.dumps(env.raw), [problem], env, verified=False)
        bad.extra["downgrade"] = True
        plan.count("downgrades")
        self._quarantine(plan, bad, now)
        plan.markers.append((logging.WARNING, "se.authn.downgrade: unsigned envelope %s claiming VM %s "
                             "refused: that VM has signed before", (env.id[:128], env.vm_id)))
        return True

    def _identity(self, plan: Plan, env: Envelope, received: datetime) -> str:
        """'' when `env` may speak as its VM, binding a new VM's name to its vmId (or moving the name of a
        VM silent for authz.NAME_RELEASE); else why not (central.intake.authz)."""
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

    def _spelling(self, plan: Plan, event_id: str) -> str:
        """The spelling of a record of this EventId in another case, if there is one (the platform feed
        made it first: Event Grid and IMDS may spell one GUID in two cases, platform_plan._spelling); else the
        VM's. An open one is looked up in the cache of open events (it holds every one); an ended one among
        the ended records cached, where the planning read puts the other spellings' ended rows of an id
        that is not open (central.runtime.ingest._prepare): a late report of it is then recognised."""
        if event_id in plan.changes.events or event_id in self.state.active:
            return event_id
        others = spellings(event_id)[1:]
        for other in others:
            if other in plan.changes.events or other in self.state.active:
                return other
        if event_id not in self.state.ended:
            for other in others:
                if other in self.state.ended:
                    return other
        return event_id

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
            event_id = self._spelling(plan, event["EventId"])
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
                rec.claim = {"by": vm.name, "rank": vm.new_events}  # central.policy.witness
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
        # Each VM in a `se.heartbeat` line at most once per heartbeat_log_every (ingest joins a segment's
        # into few lines): the Azure Monitor "heartbeats missing" alert (infra/app/alerts.bicep) reads it.
        since = None if vm.heartbeat_logged is None else (now - vm.heartbeat_logged).total_seconds()
        if since is None or since >= self.heartbeat_log_every:
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
        plan.quarantined("central", bad.vm_id or "")
        plan.log_rows.append(("Quarantine", logrows.quarantine_central(bad, now)))
        plan.changes.alerts.append(ingest_alerts.quarantined(bad, now))
        if "trustIssuer" in bad.extra:
            plan.changes.alerts.append(ingest_alerts.trust_failure(bad, now))  # deduplicated by key below
        if bad.extra.get("downgrade"):
            plan.changes.alerts.append(ingest_alerts.downgrade(bad, now))

    def _forwarder_quarantine(self, plan: Plan, env: Envelope, now: datetime) -> None:
        plan.count("quarantined")
        plan.quarantined("forwarder", env.vm_id)
        entity = logrows.quarantine_forwarder(env, now)
        plan.log_rows.append(("Quarantine", entity))
        plan.changes.alerts.append(ingest_alerts.forwarder_quarantined(env, entity["Sha256"], now))

    def _refuse(self, plan: Plan, env: Envelope, now: datetime) -> None:
        """What this envelope said that its VM may not say: kept whole in Quarantine, alerted, never
        applied (the rest of the envelope was)."""
        problems, plan.refusals = plan.refusals[:20], []
        bad = bad_from(json.dumps(env.raw), problems, env, verified=True)
        plan.count("refused")
        plan.quarantined("central", env.vm_id)
        plan.log_rows.append(("Quarantine", logrows.quarantine_central(bad, now)))
        plan.changes.alerts.append(ingest_alerts.refused(env, problems, bad.sha256, now))
        log.warning("refused from %s (%s): %s", env.vm_name, env.vm_id, problems[0]["message"])

    def _approval_result(self, plan: Plan, env: Envelope, now: datetime) -> None:
        d = env.data
        rec, active = self._event(plan, d["eventId"])
        message_id = d.get("messageId")
        sent = rec.approvals if rec else []
        attempt = next((a for a in sent if message_id and a.message_id == message_id), None)
        # central's record of the attempt this VM answers, not what the VM wrote
        decided_by = attempt.decided_by if attempt and attempt.vm_id == env.vm_id else ""
        if rec is None or not active:  # (an ended event's record still holds the attempt it answers)
            plan.log_rows.append(("Decisions", logrows.result_entity(env, now, decided_by)))
            log.warning("approval result for unknown or ended event %s from %s", d["eventId"], env.vm_name)
            return
        problem = authz.result_problem(rec, d, env.vm_id, env.vm_name)
        if problem:
            plan.refusals.append({"path": "/data", "message": problem})
            return
        plan.log_rows.append(("Decisions", logrows.result_entity(env, now, decided_by)))
        fresh = attempt is not None and attempt.result in (None, "timeout", "event-started")
        decision = apply_result(rec, d, env.vm_name, now)
        if fresh and attempt is not None:
            confirmed = d["outcome"] in DONE_OUTCOMES
            plan.metrics.append(lambda: metrics.approval_result(
                confirmed, event_id=rec.event_id, event_type=rec.event_type, vm_id=env.vm_id,
                sent_at=attempt.sent_at, result_at=now))
        if decision is not None:
            plan.metrics.append(lambda: metrics.decision(
                decision["action"], decision["rule"], event_id=rec.event_id, event_type=rec.event_type,
                state=decision["state"]))
            plan.owed.add(f"{rec.event_id}:approval-failed")
            plan.log_rows.append(
                (
                    "Decisions",
                    logrows.decision_entity(rec.event_id, rec.event_type, rec.decision_seq, decision, now),
                )
            )
            plan.touched.add(rec.event_id)
