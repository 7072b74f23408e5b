"""Ingest of the platform's witness (issue 23): Event Grid's ScheduledEventEmitted events from central's
platform hub -> State changes, committed under the store's concurrency control exactly as envelopes are
(central.runtime.ingest): planned on copies (central.intake.platform_plan), committed in segments, planned
again from re-read rows when a commit loses a race. A bad or unknown event is quarantined and alerted,
never raised: only a storage failure raises (the host retries the batch; replays are duplicates).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import List, Mapping, Sequence, Set, Tuple, Union

from cachetools import TTLCache

from central.intake import platform
from central.intake.plan import Plan
from central.intake.platform_plan import plan_platform
from central.model.alert import ALERT_LEASE, Alert
from central.model.events import spellings
from central.model.times import iso
from central.policy import witness
from central.policy.witness import WitnessRules
from central.store.fleet_state import EVENTS_PER_COMMIT, FleetState

from .ingest import Ingest, one_at_a_time_if_refused
from .results import BatchResult

log = logging.getLogger("central.ingest")
# Event Grid ids remembered in memory (the durable check is on the event's row): Event Grid's own retries
# of a delivery and the host's redelivery; bounded in time and in count, as the envelopes' (service.py)
SEEN_LIMIT = 50_000
SEEN_SECONDS = 3600.0


class PlatformIngest:
    def __init__(self, state: FleetState, ingest: Ingest) -> None:
        self.state = state
        self.ingest = ingest  # its owed alerts and log staging are the call's (service._run delivers them)
        self.seen: TTLCache = TTLCache(maxsize=SEEN_LIMIT, ttl=SEEN_SECONDS)

    def apply(self, bodies: Sequence[Union[bytes, str]], received: Sequence[datetime], now: datetime,
              result: BatchResult) -> Set[str]:
        items: List[Tuple[platform.Parsed, datetime]] = []
        for body, at in zip(bodies, received):
            for parsed in platform.parse_body(body):
                if isinstance(parsed, platform.PlatformEvent):
                    if parsed.grid_id in self.seen:
                        result.duplicates += 1
                        continue
                items.append((parsed, at))
        touched: Set[str] = set()
        size = max(1, EVENTS_PER_COMMIT - 5)
        for start in range(0, len(items), size):
            touched |= self._commit(items[start:start + size], now, result)
        for parsed, _ in items:
            if isinstance(parsed, platform.PlatformEvent):
                self.seen[parsed.grid_id] = None  # the oldest goes when full (cachetools)
        return touched

    def _commit(self, segment: List[Tuple[platform.Parsed, datetime]], now: datetime,
                result: BatchResult) -> Set[str]:
        ids = [p.event_id for p, _ in segment if isinstance(p, platform.PlatformEvent)]

        def plan_once() -> Plan:
            self.state.ensure_loaded()
            self.state.forget_absent()
            if ids:  # (both spellings: platform_plan._spelling looks an event up in either case)
                self.state.prefetch_ended([s for i in ids for s in spellings(i)])
            return plan_platform(self.state, segment, now, self.ingest.raised)

        def set_aside(item: Tuple[platform.Parsed, datetime], why: str) -> Set[str]:
            parsed, at = item
            if not isinstance(parsed, platform.PlatformEvent):  # a quarantine row the store refuses: no lower
                return self.ingest.unstorable(parsed, why, now, result)
            text = json.dumps(parsed.raw, default=str, ensure_ascii=False)
            log.error("platform event set aside: the store refuses its rows: %s", why)
            return self._commit([(platform.bad(text, f"the log store refused its rows: {why}"[:300],
                                               parsed.grid_id), at)], now, result)

        return one_at_a_time_if_refused(
            segment, lambda: self.ingest.commit_planned(plan_once, now, result, "platform ingest"),
            lambda part: self._commit(part, now, result), set_aside)


def unconfirmed_alerts(state: FleetState, rules: WitnessRules, now: datetime,
                       raised: Mapping[str, None]) -> List[Alert]:
    """Timer: open events only VMs reported, naming an opted-in VM, that the platform has not emitted within
    its grace (central.policy.witness): one warning each. They already count toward no budget."""
    if not rules.confirm_scopes:
        return []
    due = [rec for rec, _ in state.active.values()
           if not rec.ended and not rec.platform and now - rec.first_seen > rules.confirm_grace
           and f"{rec.event_id}:unconfirmed" not in raised]
    if not due:
        return []
    vms = state.vms_by_name({name for rec in due for name in rec.resources})
    out = []
    for rec in due:
        named = [vms[n] for n in rec.resources if n in vms]
        if not witness.unconfirmed(rec, named, rules, now):
            continue
        claimed = rec.claim.get("by") or ", ".join(sorted(rec.reported_by)) or "?"
        out.append(Alert(
            f"{rec.event_id}:unconfirmed", "unconfirmed", "warning",
            f"{rec.event_type} {rec.event_id}: the platform never emitted it",
            f"Reported by {claimed} only; the platform feed has not emitted it "
            f"{int(rules.confirm_grace.total_seconds())} s after its first sight "
            f"({iso(rec.first_seen)}), though it names opted-in VMs. It counts toward no disruption "
            "budget. A made-up event, or the feed is late or off for these VMs.",
            now, rec.event_id, rec.status, facts={"claimedBy": claimed, "resources": rec.resources[:20]},
            next_try=now + ALERT_LEASE))
    return out
