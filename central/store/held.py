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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from central.model.times import aware

from .log_rows import day
from .tables import MAX_OPS, Conflict, Op, TableLog

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


def claim(store: TableLog, rows: Sequence[Tuple[str, str, str]], now: datetime,
          by: str) -> Dict[Tuple[str, str], str]:
    """Claim kept rows (partition, row, etag) for this instance: {(partition, row): new ETag} of those
    claimed; a row another instance changed first is left out (it applies that one). One transaction per
    partition chunk of up to 100 rows; a chunk that lost a race is claimed again row by row."""
    until = now + timedelta(seconds=CLAIM_SECONDS)
    return _each(store, rows, lambda p, r: {"PartitionKey": p, "RowKey": r, "Reverify": "claimed",
                                           "ReverifyBy": by[:128], "ReverifyUntil": until})


def done(store: TableLog, rows: Sequence[Tuple[str, str, str, str, str]], now: datetime) -> int:
    """Mark claimed rows (partition, row, etag of the claim, outcome, reason) done; returns how many (a row
    whose claim lapsed and another instance took is left to that one)."""
    marks = {(p, r): (o, why) for p, r, _, o, why in rows}
    return len(_each(store, [(p, r, e) for p, r, e, _, _ in rows], lambda p, r: {
        "PartitionKey": p, "RowKey": r, "Reverify": "done", "Reverified": marks[(p, r)][0],
        "ReverifiedAt": now, "ReverifyReason": marks[(p, r)][1][:1000]}))


def _each(store: TableLog, rows: Sequence[Tuple[str, str, str]],
          entity: Callable[[str, str], Dict[str, Any]]) -> Dict[Tuple[str, str], str]:
    by_partition: Dict[str, List[Tuple[str, str, str]]] = {}
    for row in rows:
        by_partition.setdefault(row[0], []).append(row)
    out: Dict[Tuple[str, str], str] = {}
    for group in by_partition.values():
        for i in range(0, len(group), MAX_OPS):
            chunk = group[i:i + MAX_OPS]
            try:
                ops = [Op("merge", entity(p, r), e or None) for p, r, e in chunk]
                etags = store.transact("Quarantine", ops)
                out.update({(p, r): t or "" for (p, r, _), t in zip(chunk, etags)})
            except Conflict:
                if len(chunk) == 1:
                    continue  # another instance changed it first
                for one in chunk:
                    out.update(_each(store, [one], entity))
    return out
