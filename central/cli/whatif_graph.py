"""`se-policy whatif FILE --from-resource-graph --since 30d [--subscription ID ...]`: rehearse a policy on the
real fleet's scheduled events as Azure Resource Graph keeps them, before deploying anything.

The read (central.cli.resource_graph) and the conversion (central.cli.graph_rows) are separate; this module
replays and prints. What Resource Graph lacks is said in the output every time (LIMITS), not only in docs:
- timed events (still Scheduled, so with a NotBefore) are replayed together, budgets and windows included;
- timeless ones (the row was updated in place to Started, Completed or Canceled and kept no time) are each
  decided alone, as if first seen at --now: which rule takes them, not how they would have queued;
- no row says whether or when an event was approved, so each is compared with "no approval": "approved"
  means the candidate would have approved it before NotBefore, "held" that it would have left it to NotBefore.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from datetime import datetime, timedelta
from typing import Any, Callable, Dict, List, Optional, TextIO

from central.model.times import iso
from central.policy.document import Policy

from . import graph_rows, resource_graph, whatif

EXIT_HISTORY = 4  # Resource Graph unreachable, or its answer unreadable
EXIT_AZURE_ACCESS = 5  # no Azure login, or the login or a --subscription refused
_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
LIMITS = ("Resource Graph keeps one row per event, updated in place: the latest status only, no history of "
          "transitions, no time once an event has started, no record of approvals and no tags; how long it "
          "keeps rows is not documented. Central's own log store (--since without --from-resource-graph) "
          "has all of that.")


class GraphUsageError(ValueError):
    """Bad arguments for the Resource Graph source: se-policy's usage exit (3)."""


def add_arguments(cmd: Any) -> None:
    cmd.add_argument("--from-resource-graph", action="store_true",
                     help="with --since: the fleet's scheduled events from Azure Resource Graph (your Azure "
                          "login; preview feed, see docs/analytics.md for its limits)")
    cmd.add_argument("--subscription", action="append", default=[], metavar="ID",
                     help="with --from-resource-graph: a subscription id to read (repeat; default: every "
                          "subscription your login can read)")
    cmd.add_argument("--resource-graph-endpoint", metavar="URL",
                     help=f"Resource Graph's ARM endpoint (default ${resource_graph.ENDPOINT_ENV} or "
                          f"{resource_graph.DEFAULT_ENDPOINT}; the sandbox points it at its stand-in)")
    cmd.add_argument("--max-rows", type=int, default=resource_graph.MAX_ROWS,
                     help=f"read at most this many rows (default {resource_graph.MAX_ROWS})")


def run(args: argparse.Namespace, policy: Policy, now: datetime, since: timedelta, out: TextIO,
        credential: Optional[Callable[[], Any]] = None) -> int:
    for sub in args.subscription:
        if not _GUID.match(sub):
            raise GraphUsageError(f"--subscription {sub!r} is not a subscription id (a GUID: az account list "
                                  "--query [].id -o tsv)")
    if args.max_rows < 1:
        raise GraphUsageError("--max-rows must be at least 1")
    endpoint = (args.resource_graph_endpoint or os.environ.get(resource_graph.ENDPOINT_ENV, "")
                or resource_graph.DEFAULT_ENDPOINT)
    try:
        cred = (credential or resource_graph.credential)()
        got = resource_graph.read(cred, args.subscription, endpoint, args.max_rows)
    except resource_graph.GraphError as exc:
        print(f"se-policy: {exc}", file=out)
        return EXIT_AZURE_ACCESS if exc.access else EXIT_HISTORY
    past = graph_rows.from_rows(got.rows, now - since, now)
    step = timedelta(seconds=args.step)
    timed = whatif.replay(past.timed, past.vms, policy, step=step)
    alone = [r for p in past.timeless for r in whatif.replay([p], past.vms, policy, step=step)]
    results = timed + alone
    counts = _summary(results, len(alone))
    read = {"rows": len(got.rows), "pages": got.pages, "totalRecords": got.total, "truncated": got.truncated,
            "maxRows": args.max_rows, "skipped": past.skipped[:20], "beforeSince": past.before_since,
            "statuses": past.statuses, "subscriptions": args.subscription or "all the login can read"}
    if args.json:
        doc = {"policy": args.file, "source": f"resource graph ({endpoint}), since {args.since}",
               "now": iso(now),
               "read": read, "limits": LIMITS, "summary": counts,
               "events": [dict(r.to_json(), timeless=r in alone) for r in results]}
        json.dump(doc, out, indent=2)
        print(file=out)
        return 0
    print(f"Resource Graph: {len(got.rows)} row(s) in {got.pages} page(s)"
          + (f", stopped at --max-rows {args.max_rows} of {got.total}" if got.truncated else "")
          + f"; latest statuses {_statuses(past.statuses)}", file=out)
    if past.skipped:
        print(f"  {len(past.skipped)} row(s) left out: {'; '.join(past.skipped[:3])}", file=out)
    if not results:
        print("no events in this history", file=out)
    else:
        print(_table(results, alone), file=out)
        print(f"\n{counts['events']} event(s) replayed through {args.file}: {counts['approved']} approved "
              f"before NotBefore, {counts['held']} left to NotBefore; {counts['budgetWaits']} waited for a "
              f"budget, {counts['windowWaits']} for a window. {counts['timeless']} had no time in Resource "
              f"Graph and were each decided alone as of {iso(now)}; {past.before_since} Scheduled row(s) "
              f"were older than --since {args.since}.", file=out)
    print(f"Limits: {LIMITS}", file=out)
    return 0


def _summary(results: List[whatif.Replayed], timeless: int) -> Dict[str, int]:
    base = whatif.summary(results)
    return {"events": base["events"], "approved": sum(1 for r in results if r.whatif_at is not None),
            "held": sum(1 for r in results if r.whatif_at is None), "budgetWaits": base["budgetWaits"],
            "windowWaits": base["windowWaits"], "timeless": timeless}


def _statuses(statuses: Dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())) or "none"


def _table(results: List[whatif.Replayed], alone: List[whatif.Replayed]) -> str:
    rows = [("EVENT", "TYPE", "VMS", "TIME IN GRAPH", "WHAT-IF")]
    for r in results:
        in_graph = ("none (decided alone)" if r in alone
                    else f"NotBefore {iso(r.not_before)}" if r.not_before else "")
        rows.append((r.event_id[:12], r.event_type, whatif.vms_cell(r.resources), in_graph,
                     whatif.whatif_cell(r)))
    return whatif.aligned(rows)
