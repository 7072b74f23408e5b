"""The operator's decisions as CentralService carries them out (approve, hold, release): read the event
from the shared state (its id in any case), take the pure verdict (central.policy.operator_verdicts),
commit it under the head like every decision, then log, alert, send and answer. CentralService owns one
and hands it the parts it uses (state, store, evaluator, actor, the decide config, its lock and flush)."""

from __future__ import annotations

import copy
import logging
import threading
from datetime import datetime
from typing import Any, Callable, Dict, Optional

from central.model.events import EventRecord
from central.model.times import aware
from central.policy.arm_route import arm_owner
from central.policy.decide import DecideConfig, unapprovable
from central.policy.fleet_view import FleetView
from central.policy.operator_verdicts import (
    OPERATOR_ACTIONS,
    operator_alert,
    operator_approve,
    operator_hold,
    operator_release,
)
from central.store import log_rows as logrows
from central.store.fleet_state import Changes, FleetState
from central.store.tables import Conflict, StoreError, TableLog
from central.telemetry import metrics

from .act import Actor
from .evaluator import Evaluator, ToSend, apply, owe, to_result
from .results import BatchResult, InvalidRequest, UnknownEvent

log = logging.getLogger("central.service")  # the se.operator marker's logger (the workbook reads it)
MAX_TRIES = 8


class OperatorDesk:
    def __init__(self, state: FleetState, store: TableLog, evaluator: Evaluator, actor: Actor,
                 config: DecideConfig, lock: threading.RLock, flush: Callable[[BatchResult], None]) -> None:
        self.state = state
        self.store = store
        self.evaluator = evaluator
        self.actor = actor
        self.config = config
        self._lock = lock
        self._flush = flush

    def decide(
        self, event_id: str, action: str, operator: str, reason: str,
        now: Optional[datetime] = None, hook: bool = False, via: str = "queue",
    ) -> Dict[str, Any]:
        """An operator's decision, binding on every instance from the moment this returns (committed under
        the head like every decision), logged and alerted: "approve" (now, to the elected leader; windows
        and budgets do not apply; `hook`: the VM drains first; `via` "arm": through ARM at the event's owning
        resource, no VM involved), "hold" (no automatic approval until an operator releases or approves it)
        or "release" (the policy decides it again at once)."""
        if action not in OPERATOR_ACTIONS:
            raise InvalidRequest(f"action must be one of {', '.join(OPERATOR_ACTIONS)}, not {action!r}")
        if not operator.strip():
            raise InvalidRequest("operator is required (who decides)")
        if hook and action != "approve":
            raise InvalidRequest('"hook" goes with approve only')
        if via not in ("queue", "arm"):
            raise InvalidRequest(f'"via" must be "queue" or "arm", not {via!r}')
        if via == "arm" and (action != "approve" or hook):
            raise InvalidRequest('"via": "arm" goes with approve only, without "hook" (ARM runs no hook)')
        with self._lock:
            now = aware(now)
            result = BatchResult()
            who, why = operator.strip()[:200], reason.strip()[:4000] or "(no reason given)"
            self.state.refresh()
            for _ in range(MAX_TRIES):
                rec, active = self.state.find_event_any_case(event_id)
                if rec is None:
                    raise UnknownEvent(f"no event {event_id!r} is known to central")
                event_id = rec.event_id
                mine = copy.deepcopy(rec)
                verdict = self._operator_verdict(mine, active, action, who, why, hook, now, via)
                owed: set = set()
                decision = apply(mine, verdict, now, owed)
                if decision is not None:
                    owe(mine, operator_alert(mine, verdict, who, why, now))
                    owed.add(f"{event_id}:operator:{mine.decision_seq}")
                try:
                    self.state.commit(Changes(events={event_id: mine}), now)
                except Conflict:  # the state re-read the rows: decide again on them
                    continue
                break
            else:
                raise StoreError(f"{event_id}: still losing races after {MAX_TRIES} re-reads (contention)")
            if decision is not None:
                log.warning(metrics.OPERATOR_MARKER, event_id, verdict.action, who.replace(" ", "_"), why)
                metrics.decision(decision["action"], decision["rule"], event_id=event_id,
                                 event_type=mine.event_type, state=decision["state"])
                self.store.stage(
                    "Decisions",
                    logrows.decision_entity(mine.event_id, mine.event_type, mine.decision_seq, decision, now),
                )
                result.decisions.append(to_result(event_id, decision, now))
            sends = [ToSend(event_id, len(mine.approvals))] if verdict.kind == "send" else []
            if action == "release":  # the policy decides it again, now
                sends += self.evaluator.run([event_id], now, result)
                owed |= self.evaluator.owed
            self.actor.act(sends, owed, now, result)
            self._flush(result)
            if action == "approve" and verdict.kind == "record" and verdict.action == "operator-approve":
                raise InvalidRequest(f"cannot approve {event_id}: {verdict.reason}")
            if action == "approve" and result.errors:
                raise InvalidRequest(f"cannot approve {event_id}: {result.errors[-1]}")
            return self.state.active[event_id][0].view() if event_id in self.state.active else mine.view()

    def _operator_verdict(self, mine: EventRecord, active: bool, action: str, who: str,
                          why: str, hook: bool, now: datetime, via: str = "queue") -> Any:
        if not active or mine.ended:
            raise InvalidRequest(f"cannot {action} {mine.event_id}: it has ended ({mine.status})")
        if action == "hold":
            mine.hold_seq = self.state.head_seq + 1
            return operator_hold(mine, who, why, now)
        if action == "release":
            if not mine.operator_hold:
                raise InvalidRequest(f"cannot release {mine.event_id}: no operator holds it")
            return operator_release(mine, who, why)
        problem = unapprovable(mine, now)
        if problem:
            raise InvalidRequest(f"cannot approve {mine.event_id}: {problem}")
        was_held, mine.operator_hold = mine.operator_hold, False
        fleet = self.evaluator.view(now, [mine])
        view = FleetView(dict(fleet.vms_by_name), fleet.open_events, self.config.liveness, fleet.known,
                         fleet.rules, fleet.groups_hint, fleet.stale)
        if via == "arm" and arm_owner(mine, view.vms_of(mine)) is None:
            raise InvalidRequest(f"cannot approve {mine.event_id} through ARM: its owning resource is not "
                                 "known (no platform feed for it, and no forwarder of its VMs reported it)")
        return operator_approve(mine, view, now, self.config, who, why, hook, via_arm=via == "arm",
                                was_held=was_held)

