"""The simulated fabric: VMs, events, each VM's DocumentIncarnation, and the event lifecycle.

Lifecycle: Scheduled -> Started (approved, or NotBefore passed; NotBefore becomes "") -> gone
`startedSeconds` (simulated) later. An event may also be cancelled (gone without starting) or
created Started. Transitions are applied lazily on every read, in time order, one incarnation
step each, and by a light background thread that sleeps until the next one is due, so a change
bumps the incarnation even when nobody polls. Every method takes the one lock.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .clock import Clock, rfc1123
from .events import CANCELLED, COMPLETED, SCHEDULED, STARTED, SimEvent
from .identity import Identity, moved

_MAX_STEPS = 100_000  # bounds one catch-up; far above anything a test or demo schedules
_IDLE_WAIT = 5.0


class UnknownVm(KeyError):
    pass


class UnknownEvent(KeyError):
    pass


class Conflict(ValueError):
    pass


@dataclass
class VmState:
    identity: Identity
    incarnation: int = 1  # the docs' example sequence starts at 1 with no events
    view: List[Dict[str, Any]] = field(default_factory=list)
    calls: int = 0  # /metadata requests served so far (for --first-call-delay)


class Fabric:
    def __init__(self, clock: Clock, identities: Sequence[Identity]) -> None:
        if not identities:
            raise ValueError("at least one VM is needed")
        self.clock = clock
        self._initial = [copy.deepcopy(i) for i in identities]
        self._cond = threading.Condition(threading.RLock())
        self._stopped = False
        self.vms: Dict[str, VmState] = {}
        self.events: Dict[str, SimEvent] = {}
        # called with a copy of an event and the instant of each transition (the platform feed), under
        # the lock: a listener only queues
        self.listeners: List[Callable[[SimEvent, float], None]] = []
        self.reset()

    # ---- VMs -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Back to the start state: the initial VMs at incarnation 1, no events."""
        with self._cond:
            self.vms = {i.name: VmState(copy.deepcopy(i)) for i in self._initial}
            self.events = {}
            self._cond.notify_all()

    def first_vm(self) -> str:
        with self._cond:
            return next(iter(self.vms))

    def vm_names(self) -> List[str]:
        with self._cond:
            return list(self.vms)

    def vm(self, name: str) -> VmState:
        with self._cond:
            if name not in self.vms:
                raise UnknownVm(name)
            return self.vms[name]

    def add_vm(self, identity: Identity) -> Identity:
        with self._cond:
            if identity.name in self.vms:
                raise Conflict(f"VM {identity.name!r} exists")
            self.vms[identity.name] = VmState(identity)
            return identity

    def move_vm(self, name: str, spec: Mapping[str, Any]) -> Identity:
        """Azure's resource move (identity.moved), under the lock."""
        with self._cond:
            identity = self.vm(name).identity
            moved(identity, spec)
            return identity

    def count_call(self, name: str) -> int:
        """Counts a /metadata request to VM `name`; returns how many came before it."""
        with self._cond:
            state = self.vm(name)
            state.calls += 1
            return state.calls - 1

    # ---- documents ------------------------------------------------------------------------
    def document(self, name: str) -> Tuple[int, List[Dict[str, Any]]]:
        """(DocumentIncarnation, every field of every event) for VM `name`, as of now."""
        with self._cond:
            self._advance(self.clock.now())
            state = self.vm(name)
            return state.incarnation, copy.deepcopy(state.view)

    def reset_incarnation(self, names: Sequence[str], to: Optional[int]) -> Dict[str, int]:
        """What an IMDS reset looks like: the same content under a lower incarnation."""
        with self._cond:
            self._advance(self.clock.now())
            done = {}
            for name in names:
                state = self.vm(name)
                target = to if to is not None else (1 if state.incarnation > 1 else 0)
                state.incarnation = max(0, min(target, state.incarnation - 1))
                done[name] = state.incarnation
            return done

    # ---- events ---------------------------------------------------------------------------
    def add_event(self, event: SimEvent) -> SimEvent:
        with self._cond:
            if event.event_id in self.events:
                raise Conflict(f"event {event.event_id!r} exists")
            now = self.clock.now()
            self._advance(now)
            event.created_at = now
            if event.state == STARTED:
                self._start(event, now)
            else:
                event.not_before = self.clock.not_before(event.notice_seconds, now)
                self._emit(event, now)
            self.events[event.event_id] = event
            self._refresh()
            self._cond.notify_all()
            return copy.deepcopy(event)

    def list_events(self) -> List[SimEvent]:
        with self._cond:
            self._advance(self.clock.now())
            return copy.deepcopy(list(self.events.values()))

    def get_event(self, event_id: str) -> SimEvent:
        with self._cond:
            self._advance(self.clock.now())
            if event_id not in self.events:
                raise UnknownEvent(event_id)
            return copy.deepcopy(self.events[event_id])

    def approve(self, vm_name: str, event_ids: Sequence[str]) -> None:
        """POST StartRequests from VM `vm_name`. All ids are checked before any is applied.

        Known = any event whose audience includes this VM, live or already gone (our choice; an
        approval racing the event's end is not an error). Starting a Started event is a no-op.
        """
        with self._cond:
            now = self.clock.now()
            self._advance(now)
            unknown = [i for i in event_ids if i not in self.events or vm_name not in self.events[i].audience]
            if unknown:
                raise UnknownEvent(", ".join(unknown))
            for event_id in event_ids:
                event = self.events[event_id]
                event.approved_by.append(vm_name)
                if event.state == SCHEDULED:
                    self._start(event, now)  # for every VM of its audience at once
                    self._refresh()
            self._cond.notify_all()

    def start_now(self, event_id: str) -> SimEvent:
        """The platform starts a Scheduled event now (admin)."""
        return self._end_or_start(event_id, start=True)

    def cancel(self, event_id: str) -> SimEvent:
        """The event vanishes without (further) running."""
        return self._end_or_start(event_id, start=False)

    def _end_or_start(self, event_id: str, start: bool) -> SimEvent:
        with self._cond:
            now = self.clock.now()
            self._advance(now)
            event = self.events.get(event_id)
            if event is None:
                raise UnknownEvent(event_id)
            if not event.live or (start and event.state != SCHEDULED):
                raise Conflict(f"event {event_id!r} is {event.state}")
            if start:
                self._start(event, now)
            else:
                event.state, event.ended_at = CANCELLED, now
                self._emit(event, now)
            self._refresh()
            self._cond.notify_all()
            return copy.deepcopy(event)

    # ---- lifecycle ------------------------------------------------------------------------
    def _start(self, event: SimEvent, at: float) -> None:
        event.state, event.started_at, event.not_before = STARTED, at, None
        event.gone_at = at + self.clock.real_seconds(event.started_seconds)
        self._emit(event, at)

    def _emit(self, event: SimEvent, at: float) -> None:
        for listener in self.listeners:
            listener(copy.deepcopy(event), at)

    def _next_due(self) -> Optional[Tuple[float, SimEvent]]:
        best: Optional[Tuple[float, SimEvent]] = None
        for event in self.events.values():
            due = {SCHEDULED: event.not_before, STARTED: event.gone_at}.get(event.state)
            if due is not None and (best is None or due < best[0]):
                best = (due, event)
        return best

    def _advance(self, now: float) -> None:
        """Apply every transition due by `now`, oldest first, refreshing documents after each."""
        for _ in range(_MAX_STEPS):
            due = self._next_due()
            if due is None or due[0] > now:
                return
            at, event = due
            if event.state == SCHEDULED:
                self._start(event, at)
            else:
                event.state, event.ended_at = COMPLETED, at
                self._emit(event, at)
            self._refresh()

    def _refresh(self) -> None:
        """Recompute each VM's event list; bump its incarnation when it changed."""
        for name, state in self.vms.items():
            view = [e.imds(rfc1123(e.not_before) if e.not_before else "")
                    for e in self.events.values() if e.live and name in e.audience]
            if view != state.view:
                state.view = view
                state.incarnation += 1

    # ---- background clock -----------------------------------------------------------------
    def run_clock(self) -> None:
        """Sleep until the next transition is due (or something changes), apply it; until stop()."""
        with self._cond:
            while not self._stopped:
                now = self.clock.now()
                self._advance(now)
                due = self._next_due()
                wait = _IDLE_WAIT if due is None else min(_IDLE_WAIT, max(0.01, due[0] - now))
                self._cond.wait(timeout=wait)

    def start_clock(self) -> threading.Thread:
        thread = threading.Thread(target=self.run_clock, name="imds-clock", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
