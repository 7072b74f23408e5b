"""Re-verification of the envelopes kept for a trust failure, once trust is repaired (issue 22, point 2).

Reads the kept Quarantine rows (central.store.held), re-verifies each as of the time central received it
with this instance's current trust (central.intake.reverify.plan), and applies each verified one through
the normal ingest commit path (central.runtime.ingest) with that receive time, so it counts as having
arrived then: a report that a newer incarnation already superseded is logged (`Applied` false in
Incarnations) and not acted on. Rows that still fail stay kept; rows applied are marked done under
their ETags (claim first, so two instances running this at once apply each row at most once).

When it runs (CentralService):
- on the `reevaluate` timer: at this instance's first tick (a changed trust setting, AUTHN_TRUST_PEM or
  AUTHN_AIA_HOSTS, restarts the app, so the first tick after a repair re-verifies), then every
  RETRY_SECONDS (an AIA host that became reachable again, with no setting changed; one query when
  nothing is held);
- at once on the operator's `POST /api/authn/reverify` (`se-fleet reverify`).

Rows past the keep window (AUTHN_HELD_DAYS) are given up on the timer, once a day per instance
(`give_up`): marked done under their ETags and named in one critical alert, so none leaves the count unseen.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from central.intake import reverify as planning
from central.intake.plan import Item
from central.model.alert import Alert
from central.model.envelope import INCARNATION
from central.model.times import aware
from central.store import held as kept
from central.store.tables import TableLog, get_json

from .results import BatchResult

log = logging.getLogger("central.reverify")  # stable: docs and queries select on it

RETRY_SECONDS = 3600.0
SWEEP_SECONDS = 86400.0  # rows past the keep window are looked for once a day per instance (and at its start)
SUMMARY_SECONDS = 60.0  # health's count of held envelopes is at most this old (one query per minute)
OUTCOMES = ("verified", "applied", "superseded", "refused", "duplicate", "untrusted", "unreadable",
            "raced")


def held_of(entity: Dict[str, Any], etag: str) -> planning.Held:
    """A kept row as the planner reads it."""
    body = get_json(entity, "Body")
    props = get_json(entity, "AuthProperties")
    enqueued = entity.get("EnqueuedAt") or entity.get("ReceivedAt")
    return planning.Held(
        str(entity["PartitionKey"]), str(entity["RowKey"]), etag,
        body if isinstance(body, str) else None,
        {str(k): str(v) for k, v in props.items()} if isinstance(props, dict) else None,
        aware(enqueued if isinstance(enqueued, datetime) else None), str(entity.get("TrustIssuer") or ""))


class Reverifier:
    """One per CentralService. `apply(items, now, result)` commits items through ingest, in order."""

    def __init__(self, store: TableLog, verify: planning.Verify,
                 apply: Callable[[List[Item], datetime, BatchResult], Set[str]],
                 days: int = kept.HELD_DAYS) -> None:
        self.store = store
        self.verify = verify
        self.apply = apply
        self.days = days  # AUTHN_HELD_DAYS: the keep window
        self.last_sweep: Optional[datetime] = None
        self.by = f"{socket.gethostname()}:{os.getpid()}"
        self.last_run: Optional[datetime] = None
        self.last: Dict[str, int] = {}
        self._summary: Optional[Tuple[datetime, Dict[str, Any]]] = None

    def due(self, now: datetime) -> bool:
        """The timer's rule: this instance's first tick, then every RETRY_SECONDS (one query when nothing
        is held)."""
        return _due(self.last_run, now, RETRY_SECONDS)

    def run(self, now: datetime, result: BatchResult) -> Set[str]:
        """Re-verify and apply what can be; returns the events to decide about. StoreError propagates
        (a claimed row's claim then lapses and a later run takes it again)."""
        self.last_run = now
        rows = kept.read(self.store, now, days=self.days)
        counts = {k: 0 for k in OUTCOMES}
        steps = planning.plan([held_of(e, etag) for e, etag in rows], self.verify)
        for step in steps:
            counts[step.outcome] += 1
        todo = [s for s in steps if s.outcome not in ("untrusted", "unreadable")]  # the others stay kept
        claimed = kept.claim(self.store, [(s.held.partition, s.held.row, s.held.etag) for s in todo], now,
                             self.by)
        counts["raced"] = len(todo) - len(claimed)  # another instance took those first: it applies them
        mine = [s for s in todo if (s.held.partition, s.held.row) in claimed]
        outcomes: Dict[Tuple[str, str], str] = {}
        touched: Set[str] = set()
        batch: List[Item] = []
        for step in mine:
            key = (step.held.partition, step.held.row)
            outcomes[key] = "applied" if step.outcome == "verified" else step.outcome
            if step.item is None:
                continue
            if step.outcome == "verified" and getattr(step.item.parsed, "type", "") == INCARNATION:
                touched |= self.apply(batch, now, result) if batch else set()  # keep the order
                batch = []
                before = result.stale  # one at a time: was it superseded by a newer incarnation?
                touched |= self.apply([step.item], now, result)
                outcomes[key] = "superseded" if result.stale > before else "applied"
            else:  # heartbeats, results, refusals: together (ingest segments them)
                batch.append(step.item)
        touched |= self.apply(batch, now, result) if batch else set()
        for outcome in outcomes.values():
            counts[outcome] += 1 if outcome in ("applied", "superseded") else 0
        kept.done(self.store, [(s.held.partition, s.held.row, claimed[(s.held.partition, s.held.row)],
                                outcomes[(s.held.partition, s.held.row)], s.reason) for s in mine], now)
        for step in mine:
            h = step.held
            log.info("se.reverify %s: kept envelope %s/%s received %s", outcomes[(h.partition, h.row)],
                     h.partition, h.row[:60], h.enqueued.isoformat())
        self.last = counts
        self._summary = None
        if steps:
            log.warning("se.reverify: %d kept envelope(s) re-verified: %s", len(steps),
                        ", ".join(f"{k} {v}" for k, v in counts.items() if v))
        return touched

    def give_up(self, now: datetime) -> Optional[Alert]:
        """The timer's daily sweep: mark every kept row past the keep window given up (under its ETag: of two
        instances sweeping at once, each marks and alerts on the rows it won) and return the one critical
        alert that names them, or None."""
        if not _due(self.last_sweep, now, SWEEP_SECONDS):
            return None
        rows = kept.expired(self.store, now, self.days)  # a StoreError: the next tick sweeps again
        self.last_sweep = now
        if not rows:
            return None
        reason = f"past AUTHN_HELD_DAYS ({self.days} days) without verifying: given up, never applied"
        marks = [(str(e["PartitionKey"]), str(e["RowKey"]), etag, kept.GIVEN_UP, reason) for e, etag in rows]
        marked = kept.done(self.store, marks, now)
        mine = [e for e, _ in rows if (e["PartitionKey"], e["RowKey"]) in marked]
        self._summary = None
        if not mine:
            return None
        log.error("se.reverify given-up: %d kept envelope(s) past the %d-day keep window: %s", len(mine),
                  self.days, ", ".join(f"{vm} {n}" for vm, n in planning.by_vm(mine)[:20]))
        return planning.given_up_alert(mine, self.days, now)

    def summary(self, now: datetime) -> Dict[str, Any]:
        """Envelopes held for trust (count, oldest receive time, issuers), those given up past the keep
        window (`givenUp`) and those past it not yet given up (`pastWindow`), read at most once a minute."""
        cached = self._summary
        if cached is not None and not _due(cached[0], now, SUMMARY_SECONDS):
            return cached[1]
        rows = kept.recent(self.store, now, self.days)
        window = kept.first_kept_day(now, self.days)
        held = [held_of(e, etag) for e, etag in rows
                if str(e["PartitionKey"]) >= window and kept.pending(e, now)]
        found: Dict[str, Any] = planning.summary(held)
        found["keptDays"] = self.days
        gone = [e for e, _ in rows if e.get("Reverified") == kept.GIVEN_UP]
        found["givenUp"] = planning.given_up_summary(gone)
        found["pastWindow"] = sum(1 for e, _ in rows
                                  if str(e["PartitionKey"]) < window and kept.pending(e, now))
        if self.last_run is not None:
            found["lastRun"] = {"at": self.last_run.isoformat(), **{k: v for k, v in self.last.items() if v}}
        self._summary = (now, found)
        return found


def _due(last: Optional[datetime], now: datetime, seconds: float) -> bool:
    """Every `seconds` from `last` (None: at once); a clock that went back past `last` is due at once too,
    rather than waiting until it passes the old mark again."""
    if last is None:
        return True
    gap = (now - last).total_seconds()
    return gap >= seconds or gap < 0
