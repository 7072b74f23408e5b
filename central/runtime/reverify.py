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
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime, timedelta
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from central.intake import reverify as planning
from central.intake.plan import Item
from central.model.envelope import INCARNATION
from central.model.times import aware
from central.store import held as kept
from central.store.tables import TableLog, get_json

from .results import BatchResult

log = logging.getLogger("central.reverify")  # stable: docs and queries select on it

RETRY_SECONDS = 3600.0
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
                 apply: Callable[[List[Item], datetime, BatchResult], Set[str]]) -> None:
        self.store = store
        self.verify = verify
        self.apply = apply
        self.by = f"{socket.gethostname()}:{os.getpid()}"
        self.last_run: Optional[datetime] = None
        self.last: Dict[str, int] = {}
        self._summary: Optional[Tuple[datetime, Dict[str, Any]]] = None

    def due(self, now: datetime) -> bool:
        """The timer's rule: this instance's first tick, then every RETRY_SECONDS (one query when nothing
        is held)."""
        if self.last_run is None:
            return True
        return (now - self.last_run).total_seconds() >= RETRY_SECONDS

    def run(self, now: datetime, result: BatchResult) -> Set[str]:
        """Re-verify and apply what can be; returns the events to decide about. StoreError propagates
        (a claimed row's claim then lapses and a later run takes it again)."""
        self.last_run = now
        rows = kept.read(self.store, now)
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

    def summary(self, now: datetime) -> Dict[str, Any]:
        """Envelopes held for trust (count, oldest receive time, issuers), read at most once a minute."""
        cached = self._summary
        if cached is not None and now - cached[0] < timedelta(seconds=SUMMARY_SECONDS):
            return cached[1]
        rows = kept.read(self.store, now, columns=kept.SUMMARY_COLUMNS)
        found: Dict[str, Any] = planning.summary([held_of(e, etag) for e, etag in rows])
        if self.last_run is not None:
            found["lastRun"] = {"at": self.last_run.isoformat(), **{k: v for k, v in self.last.items() if v}}
        self._summary = (now, found)
        return found
