"""The Quarantine rows kept for a trust failure (`FailureClass` = trust), read back for re-verification
(central.intake.reverify plans it, central.runtime.reverify runs it).

A kept row moves, under its ETag, from held to claimed (one instance re-verifies it for CLAIM_SECONDS) to
done (`Reverified` = applied | superseded | refused | duplicate). Two instances that read the same row
race on the claim: the loser's conditional merge fails (412) and it skips the row, so each row is applied
at most once while its claim stands; an instance that dies after claiming leaves a claim that lapses, and
the next run applies the row again (ingest is idempotent: a replayed incarnation or heartbeat is stale).
A done row stays in the table (nothing is deleted): the Quarantine table is the record.

A row is re-verified while it is younger than the keep window (AUTHN_HELD_DAYS, by its UTC day partition).
Past it, it is given up (`expired` finds it): marked done with `Reverified` = given-up, counted in health
and alerted on, so nothing leaves the count unseen.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from central.model.times import aware

from .log_rows import day
from .tables import MAX_OPS, Conflict, Op, TableLog

HELD_DAYS = 7  # AUTHN_HELD_DAYS' default: kept rows older than this are given up, not re-verified
GIVEN_UP = "given-up"  # the `Reverified` outcome of a row that passed the keep window
SHOWN_DAYS = 30  # the partitions this many days past the window: swept for rows to give up, shown in health
CLAIM_SECONDS = 600
SUMMARY_COLUMNS = ["PartitionKey", "RowKey", "EnqueuedAt", "TrustIssuer", "Reverify", "ReverifyUntil",
                   "Reverified", "ReverifiedAt", "VmId", "VmName"]


def read(store: TableLog, now: datetime, columns: Optional[List[str]] = None,
         days: int = HELD_DAYS) -> List[Tuple[Dict[str, Any], str]]:
    """(entity, etag) of every trust-refused row of the last `days` days not done and not claimed by a
    live claim. `columns`: only those; None: whole rows."""
    found = _trust_rows(store, "PartitionKey ge @d0 and PartitionKey le @d1",
                        {"d0": first_kept_day(now, days), "d1": day(now + timedelta(days=1))}, columns)
    return [(e, etag) for e, etag in found if pending(e, now)]


def first_kept_day(now: datetime, days: int) -> str:
    """The oldest day partition still re-verified; older partitions are past the keep window."""
    return day(now - timedelta(days=days))


def recent(store: TableLog, now: datetime, days: int = HELD_DAYS) -> List[Tuple[Dict[str, Any], str]]:
    """Health's view, one query: every trust-refused row (summary columns) from SHOWN_DAYS past the keep
    window up to today, done or not (central.intake.reverify.summary sorts them)."""
    since = day(now - timedelta(days=days + SHOWN_DAYS))
    return _trust_rows(store, "PartitionKey ge @d0 and PartitionKey le @d1",
                       {"d0": since, "d1": day(now + timedelta(days=1))}, SUMMARY_COLUMNS)


def expired(store: TableLog, now: datetime, days: int = HELD_DAYS) -> List[Tuple[Dict[str, Any], str]]:
    """(entity, etag) of every trust-refused row past the keep window, in the SHOWN_DAYS partitions after it
    (what health counts as `pastWindow`), that is not done nor under a live claim: the rows to give up.
    Bounded, so the daily sweep never re-reads the whole history: a row is older than that only when no
    instance's timer ran for SHOWN_DAYS (docs/security.md)."""
    found = _trust_rows(store, "PartitionKey ge @d0 and PartitionKey lt @d1",
                        {"d0": day(now - timedelta(days=days + SHOWN_DAYS)), "d1": first_kept_day(now, days)},
                        SUMMARY_COLUMNS)
    return [(e, etag) for e, etag in found if pending(e, now)]


def _trust_rows(store: TableLog, where: str, params: Dict[str, Any],
                columns: Optional[List[str]]) -> List[Tuple[Dict[str, Any], str]]:
    return store.query_with_etags("Quarantine", f"{where} and FailureClass eq @trust",
                                  {**params, "trust": "trust"}, select=columns)


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


def done(store: TableLog, rows: Sequence[Tuple[str, str, str, str, str]],
         now: datetime) -> Dict[Tuple[str, str], str]:
    """Mark rows (partition, row, etag, outcome, reason) done, each under its ETag; returns those marked
    {(partition, row): new ETag} (a row whose claim lapsed and another instance took is left to that one)."""
    marks = {(p, r): (o, why) for p, r, _, o, why in rows}
    return _each(store, [(p, r, e) for p, r, e, _, _ in rows], lambda p, r: {
        "PartitionKey": p, "RowKey": r, "Reverify": "done", "Reverified": marks[(p, r)][0],
        "ReverifiedAt": now, "ReverifyReason": marks[(p, r)][1][:1000]})


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
