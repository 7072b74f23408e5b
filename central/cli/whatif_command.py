"""`se-policy whatif FILE (--since 30d | --from ENVELOPES.jsonl)`: replay recorded events through a candidate
policy (central.cli.whatif) and print what would have changed, as a table or JSON.

History from the log store: `--connection-string` (Azurite; or SE_STORAGE_CONNECTION_STRING), or
`--table-endpoint https://<account>.table.core.windows.net` with the operator's Azure login
(azure-identity's DefaultAzureCredential: az login, environment, managed identity; the account has
local auth off, so Entra ID is the only way in; Storage Table Data Reader suffices).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from datetime import datetime, timedelta
from typing import Any, TextIO

from central.cli import history, whatif, whatif_graph
from central.model.times import iso
from central.policy.document import Policy

EXIT_HISTORY = 4  # the history cannot be read (store unreachable, unreadable file)
DEFAULT_TABLE_PREFIX = "scheduledevents"  # infra/main.bicep's tablePrefix default: a deployment's tables


class UsageError(Exception):
    """Bad arguments: one line, exit 3 (se-policy's usage code)."""


def add_parser(sub: Any) -> None:
    cmd = sub.add_parser("whatif", help="replay recorded events through this policy and show what changes")
    cmd.add_argument("file", help='the candidate POLICY_JSON document ("-": stdin)')
    source = cmd.add_mutually_exclusive_group(required=True)
    source.add_argument("--since", help="events first seen within this long before --now, from the log store "
                                        "(30d, 12h, 90m)")
    source.add_argument("--from", dest="source", metavar="ENVELOPES.jsonl",
                        help="exported envelopes, one per line (an envelope, or {body, enqueuedTime})")
    cmd.add_argument("--connection-string", help="log store connection string (Azurite); default "
                                                 "$SE_STORAGE_CONNECTION_STRING")
    cmd.add_argument("--table-endpoint", help="https://<account>.table.core.windows.net (your Azure login)")
    cmd.add_argument("--table-prefix", default=DEFAULT_TABLE_PREFIX,
                     help=f"the Function app's TABLE_PREFIX (default {DEFAULT_TABLE_PREFIX!r}, as infra "
                          "deploys it; '' for none)")
    cmd.add_argument("--now", help="the end of --since (ISO 8601; default: now)")
    cmd.add_argument("--step", type=int, default=60, help="replay step in seconds (default 60)")
    cmd.add_argument("--json", action="store_true", help="every event and the summary as JSON")
    whatif_graph.add_arguments(cmd)


def duration(text: str) -> timedelta:
    match = re.fullmatch(r"\s*(\d+)\s*([dhm])\s*", text or "")
    if not match:
        raise UsageError(f"--since {text!r}: give a number and d, h or m (30d, 12h, 90m)")
    value, unit = int(match.group(1)), match.group(2)
    return timedelta(days=value) if unit == "d" else timedelta(hours=value) if unit == "h" else \
        timedelta(minutes=value)


def load_history(args: argparse.Namespace, now: datetime) -> history.History:
    if args.source:
        try:
            with open(args.source, encoding="utf-8") as handle:
                return history.fold(history.envelope_lines(handle))
        except OSError as exc:
            raise history.HistoryError(f"cannot read {args.source}: {exc}") from None
    since = now - duration(args.since)
    return history.from_store(_table_service(args), args.table_prefix, since)


def _table_service(args: argparse.Namespace) -> Any:
    from azure.data.tables import TableServiceClient

    connection = args.connection_string or os.environ.get("SE_STORAGE_CONNECTION_STRING", "")
    if connection:
        return TableServiceClient.from_connection_string(connection)
    if args.table_endpoint:
        from azure.identity import DefaultAzureCredential

        return TableServiceClient(endpoint=args.table_endpoint, credential=DefaultAzureCredential())
    raise UsageError("--since reads the log store: give --connection-string or --table-endpoint "
                     "(or set SE_STORAGE_CONNECTION_STRING)")


def run(args: argparse.Namespace, policy: Policy, now: datetime, out: TextIO) -> int:
    if args.step < 1:  # a usage error, found before anything is read
        raise UsageError("--step must be at least 1 second")
    if args.from_resource_graph or args.subscription:
        if not args.from_resource_graph or not args.since:
            raise UsageError("--from-resource-graph goes with --since (30d), and --subscription with both")
        try:
            return whatif_graph.run(args, policy, now, duration(args.since), out)
        except whatif_graph.GraphUsageError as exc:
            raise UsageError(str(exc)) from None
    try:
        past, vms = load_history(args, now)
    except history.HistoryError as exc:
        print(f"se-policy: {exc}", file=out)
        return EXIT_HISTORY
    results = whatif.replay(past, vms, policy, step=timedelta(seconds=args.step))
    counts = whatif.summary(results)
    if args.json:
        source = args.source or f"log store, since {args.since}"
        doc = {"policy": args.file, "source": source, "now": iso(now), "summary": counts,
               "events": [r.to_json() for r in results]}
        json.dump(doc, out, indent=2)
        print(file=out)
        return 0
    if not results:
        print("no events in this history", file=out)
        return 0
    print(whatif.table(results), file=out)
    c = counts
    print(f"\n{c['events']} event(s) replayed through {args.file}: {c['earlier']} approved earlier, "
          f"{c['later']} later, {c['same']} the same, {c['newly-held']} newly held (left to NotBefore), "
          f"{c['newly-approved']} newly approved, {c['not-approved']} not approved either way; "
          f"{c['budgetWaits']} waited for a budget, {c['windowWaits']} for a window", file=out)
    return 0
