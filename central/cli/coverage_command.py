"""`se-fleet coverage`: every VM of a subscription, resource group or management group, from Azure Resource
Graph, joined with central's fleet (GET /api/fleet), one verdict each (central/policy/coverage.py).

    se-fleet coverage (--subscription ID [--resource-group RG] | --management-group ID)
                      [--url URL] [--api api://<client id>] [--token TOKEN]
                      [--central-principal-id GUID] [--tag se-forwarder] [--blind-only] [--json]

Resource Graph is read with the operator's own Azure login (azure-identity, as `se-policy whatif
--from-resource-graph`; SE_RESOURCE_GRAPH_ENDPOINT points it elsewhere, e.g. the sandbox's stand-in);
central with the operator API's token (as `se-fleet status`). --central-principal-id (default
$SE_CENTRAL_PRINCIPAL_ID, the FUNCTION_PRINCIPAL_ID output) finds where central may approve through ARM;
without it no VM can be agentless. Exit codes: 0 no VM blind, 1 some VM blind, 3 bad usage, 4 central or
Resource Graph unreachable or refusing, 5 no login or no right to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
from typing import Any, Callable, Dict, List, TextIO, Type

from central.cli import resource_graph
from central.policy import coverage

EXIT_OK, EXIT_BLIND, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_ACCESS = 0, 1, 3, 4, 5
MAX_VMS = 200_000


def register(sub: Any) -> Any:
    """Adds the `coverage` verb to se-fleet's subcommands; se_fleet adds the sign-in arguments and --json
    (--url, --api, --token), as to every verb that reads central."""
    one = sub.add_parser("coverage", help="every VM of a scope from Resource Graph: agent, agentless, "
                                          "silent agent or blind")
    scope = one.add_mutually_exclusive_group()
    scope.add_argument("--subscription", action="append", default=[], help="a subscription id (repeat)")
    scope.add_argument("--management-group", action="append", default=[], help="a management group id")
    one.add_argument("--resource-group", default="", help="only this resource group (one --subscription)")
    one.add_argument("--central-principal-id", default=os.environ.get("SE_CENTRAL_PRINCIPAL_ID", ""),
                     help="central's identity (FUNCTION_PRINCIPAL_ID output; "
                          "default $SE_CENTRAL_PRINCIPAL_ID)")
    one.add_argument("--tag", default="se-forwarder", help="the tag whose value 'off' leaves a VM alone")
    one.add_argument("--resource-graph-endpoint", default=os.environ.get(resource_graph.ENDPOINT_ENV, "")
                     or resource_graph.DEFAULT_ENDPOINT, help="default Azure's ARM endpoint")
    one.add_argument("--blind-only", action="store_true", help="list only blind VMs")
    return one


class UsageError(Exception):
    pass


def _check(args: argparse.Namespace) -> None:
    if not args.subscription and not args.management_group:
        raise UsageError("coverage needs a scope: --subscription ID [--resource-group RG] or "
                         "--management-group ID")
    if args.resource_group and len(args.subscription) != 1:
        raise UsageError("--resource-group needs exactly one --subscription")
    if args.resource_group and not coverage.GROUP_NAME.match(args.resource_group):
        raise UsageError(f"--resource-group {args.resource_group!r} is not a resource group name")
    for sub in args.subscription:
        if not coverage.GUID.match(sub):
            raise UsageError(f"--subscription {sub!r} is not a subscription id "
                             "(a GUID: az account list -o table)")
    if args.central_principal_id and not coverage.GUID.match(args.central_principal_id):
        raise UsageError(f"--central-principal-id {args.central_principal_id!r} is not a GUID "
                         "(FUNCTION_PRINCIPAL_ID output of infra/main.bicep)")
    if not args.url or not (args.api or args.token):
        raise UsageError("give --url and --api or --token (or set SE_CENTRAL_URL and SE_OPERATOR_API): "
                         "coverage joins central's fleet")


def _graph(args: argparse.Namespace, query: str) -> List[Dict[str, Any]]:
    read = resource_graph.read(resource_graph.credential(), args.subscription, args.resource_graph_endpoint,
                               max_rows=MAX_VMS, query=query, management_groups=args.management_group)
    if read.truncated:
        raise resource_graph.GraphError(f"more than {MAX_VMS} rows in scope: narrow it (--resource-group)",
                                        access=False)
    return read.rows


def run(args: argparse.Namespace, out: TextIO, fetch: Callable[[str, str], Dict[str, Any]],
        operator_token: Callable[[str], str], no_token: Type[Exception]) -> int:
    """The verb: one line on stderr and its exit code for every failure it expects. se_fleet passes how it
    reads central (`fetch`: GET /api/fleet) and the operator's token, so both verbs read central alike."""
    try:
        _check(args)
        token = args.token or operator_token(args.api)
        rows = _graph(args, coverage.inventory_query(args.resource_group))
        roles = _graph(args, coverage.role_query(args.central_principal_id)) if args.central_principal_id \
            else []
        fleet = fetch(args.url, token)
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except no_token as exc:
        return _fail(str(exc), EXIT_ACCESS)
    except resource_graph.GraphError as exc:
        return _fail(str(exc), EXIT_ACCESS if exc.access else EXIT_UNREACHABLE)
    except urllib.error.HTTPError as exc:
        hint = {401: ": sign in again (the token is missing, expired or for another API)",
                403: ": your account lacks the Reader or Operator app role"}.get(exc.code, "")
        return _fail(f"central answered {exc.code} {exc.reason}{hint}", EXIT_UNREACHABLE)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return _fail(f"central at {args.url} is not reachable: {exc}", EXIT_UNREACHABLE)
    covered = coverage.cover(coverage.machines(rows, args.tag), fleet, coverage.role_scopes(roles))
    if args.json:
        json.dump(coverage.report(covered), out, indent=2)
        print(file=out)
    else:
        print(coverage.render(covered, args.blind_only), file=out)
        if not args.central_principal_id:
            print("note: no --central-principal-id: no VM can be agentless (where central may approve "
                  "through ARM is not read)", file=out)
    return EXIT_BLIND if any(c.verdict == coverage.BLIND for c in covered) else EXIT_OK


def _fail(message: str, code: int) -> int:
    print(f"se-fleet: {message}", file=sys.stderr)
    return code
