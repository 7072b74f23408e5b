"""The Quarantine rows kept for a trust failure (`FailureClass` = trust), read back for re-verification
(central.intake.reverify plans it, central.runtime.reverify runs it).

A kept row moves, under its ETag, from held to claimed (one instance re-verifies it for CLAIM_SECONDS) to
done (`Reverified` = applied | superseded | refused | duplicate). Two instances that read the same row
race on the claim: the loser's conditional merge fails (412) and it skips the row, so each row is applied
at most once while its claim stands; an instance that dies after claiming leaves a claim that lapses, and
the next run applies the row again (ingest is idempotent: a replayed incarnation or heartbeat is stale).
A done row stays in the table (nothing is deleted): the Quarantine table is the record.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Dict, List, Optional, Tuple

from central.model.times import aware

from .log_rows import day
from .tables import Conflict, Op, TableLog

HELD_DAYS = 7  # kept rows older than this are not re-verified automatically (they stay in Quarantine)
CLAIM_SECONDS = 600
SUMMARY_COLUMNS = ["PartitionKey", "RowKey", "EnqueuedAt", "TrustIssuer", "Reverify", "ReverifyUntil"]


def read(store: TableLog, now: datetime, columns: Optional[List[str]] = None,
         days: int = HELD_DAYS) -> List[Tuple[Dict[str, Any], str]]:
    """(entity, etag) of every trust-refused row of the last `days` days not done and not claimed by a
    live claim. `columns`: only those (health's summary); None: whole rows."""
    found = store.query_with_etags(
        "Quarantine", "PartitionKey ge @d0 and PartitionKey le @d1 and FailureClass eq @trust",
        {"d0": day(now - timedelta(days=days)), "d1": day(now + timedelta(days=1)), "trust": "trust"},
        select=columns)
    return [(e, etag) for e, etag in found if pending(e, now)]


def pending(entity: Dict[str, Any], now: datetime) -> bool:
    state = entity.get("Reverify")
    if state == "done":
        return False
    if state == "claimed":
        until = entity.get("ReverifyUntil")
        return not isinstance(until, datetime) or aware(until) <= now
    return True


def claim(store: TableLog, partition: str, row: str, etag: str, now: datetime, by: str) -> Optional[str]:
    """Claim a kept row for this instance: its new ETag, or None when another instance changed it first."""
    entity = {"PartitionKey": partition, "RowKey": row, "Reverify": "claimed", "ReverifyBy": by[:128],
              "ReverifyUntil": now + timedelta(seconds=CLAIM_SECONDS)}
    try:
        return store.transact("Quarantine", [Op("merge", entity, etag)])[0] or ""
    except Conflict:
        return None


def done(store: TableLog, partition: str, row: str, etag: str, now: datetime, outcome: str,
         reason: str = "") -> bool:
    """Mark a claimed row done with its outcome; False when the claim lapsed and another took it."""
    entity = {"PartitionKey": partition, "RowKey": row, "Reverify": "done", "Reverified": outcome,
              "ReverifiedAt": now, "ReverifyReason": reason[:1000]}
    try:
        store.transact("Quarantine", [Op("merge", entity, etag or None)])
        return True
    except Conflict:
        return False
