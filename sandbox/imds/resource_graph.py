"""Azure Resource Graph's stand-in (issue 23, point 6): the query `se-policy whatif --from-resource-graph`
sends, answered from the fabric (every event it has held, live or ended, one row each in its latest state,
as Resource Graph keeps them: updated in place, NotBefore blank once Started) plus fixture rows
(`--resource-graph-rows FILE`: a JSON array of rows, e.g. captured from the real service).

  POST /providers/Microsoft.ResourceGraph/resources?api-version=2021-03-01
       {subscriptions?, query, options: {$top, $skipToken, resultFormat}}
       -> 200 {totalRecords, count, resultTruncated, $skipToken?, data: [rows], facets: []}

Only the scheduled-events query is understood (`maintenanceresources | where type ==
"microsoft.maintenance/scheduledevents" ...`): anything else is a 400, as an unsupported query would be.
A bearer token for ARM is required (as sandbox/imds/arm.py checks it); a subscription the stand-in does not
know is refused 403 AuthorizationFailed (what an operator sees for a subscription the login cannot read).
Pages: at most $top rows (1000 by default and at most), the skip token is the next offset.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .arm import arm_error, arm_token_problem
from .events import SimEvent
from .fabric import Fabric
from .identity import DEFAULT_SUBSCRIPTION, Identity
from .platform_feed import grid_event
from .responses import Response, json_response

PATH = "/providers/microsoft.resourcegraph/resources"
VERSIONS = ("2021-03-01", "2022-10-01", "2024-04-01")
PAGE_MAX = 1000
TENANT = "00000000-0000-0000-0000-0000000000aa"
_QUERY = re.compile(r'^\s*maintenanceresources\s*\|\s*where\s+type\s*(==|=~)\s*'
                    r'"microsoft\.maintenance/scheduledevents"', re.IGNORECASE)
_SUBSCRIPTION = re.compile(r"^/subscriptions/([^/]+)/", re.IGNORECASE)


def row_of(event: SimEvent, identities: Mapping[str, Identity]) -> Dict[str, Any]:
    """One event as a maintenanceresources row: the Event Grid resourceInfo plus the table's columns."""
    info = grid_event(event, event.ended_at or event.created_at, identities)["data"]["resourceInfo"]
    first = next((identities[r] for r in event.resources if r in identities), None)
    match = _SUBSCRIPTION.match(info["id"])
    return {"id": info["id"], "name": info["name"], "type": "microsoft.maintenance/scheduledevents",
            "tenantId": TENANT, "location": info["location"],
            "resourceGroup": first.resourceGroupName if first else "sandbox",
            "subscriptionId": match.group(1) if match else DEFAULT_SUBSCRIPTION,
            "zones": [first.zone] if first and first.zone else [], "properties": info["properties"]}


class ResourceGraphStandIn:
    def __init__(self, fabric: Fabric, fixture: Sequence[Dict[str, Any]] = ()) -> None:
        self.fabric = fabric
        self.fixture = list(fixture)
        self.calls: List[Dict[str, Any]] = []

    def rows(self) -> List[Dict[str, Any]]:
        identities = {name: vm.identity for name, vm in self.fabric.vms.items()}
        live = [row_of(e, identities) for e in self.fabric.list_events()]
        return sorted(live + self.fixture, key=lambda r: str(r.get("id", "")))

    def handle(self, method: str, path: str, query: Mapping[str, str], headers: Any, body: bytes) -> Response:
        if method != "POST" or path.rstrip("/").lower() != PATH:
            return arm_error(404, "NotFound", f"no Resource Graph route {method} {path}")
        problem = arm_token_problem(headers.get("Authorization", "") or "")
        if problem:
            return arm_error(401, "AuthenticationFailed", problem)
        if query.get("api-version") not in VERSIONS:
            return arm_error(400, "InvalidApiVersionParameter",
                             f"api-version {query.get('api-version')!r}: one of {', '.join(VERSIONS)}")
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            return arm_error(400, "BadRequest", "the body must be JSON")
        if not isinstance(request, dict) or not _QUERY.match(str(request.get("query", ""))):
            return arm_error(400, "BadRequest", "the stand-in answers only the scheduled-events query "
                                                "(maintenanceresources | where type == ...)")
        self.calls.append(request)
        rows = self.rows()
        wanted = request.get("subscriptions")
        if wanted:
            known = {str(r.get("subscriptionId", "")).lower() for r in rows} | \
                {vm.identity.subscriptionId.lower() for vm in self.fabric.vms.values()}
            unknown = [s for s in wanted if str(s).lower() not in known]
            if unknown:
                return arm_error(403, "AuthorizationFailed",
                                 f"the client has no access to subscription(s) {', '.join(unknown)}")
            asked = {str(s).lower() for s in wanted}
            rows = [r for r in rows if str(r.get("subscriptionId", "")).lower() in asked]
        answer = page(rows, request.get("options") or {})
        if answer is None:
            return arm_error(400, "BadRequest", "the $skipToken is not one this service gave")
        return json_response(200, answer)


def page(rows: Sequence[Dict[str, Any]], options: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """One page of `rows` in Resource Graph's response shape (at most $top, 1000 by default and at most; the
    skip token is the next offset), or None for a $skipToken this service never gave. Both stand-ins page
    with it (sandbox/inventory_graph.py)."""
    top = min(PAGE_MAX, max(1, int(options.get("$top") or PAGE_MAX)))
    offset = _offset(options.get("$skipToken"))
    if offset is None:
        return None
    chunk = list(rows[offset:offset + top])
    answer: Dict[str, Any] = {"totalRecords": len(rows), "count": len(chunk), "resultTruncated": "false",
                              "data": chunk, "facets": []}
    if offset + top < len(rows):
        answer["$skipToken"] = base64.urlsafe_b64encode(json.dumps({"o": offset + top}).encode()).decode()
    return answer


def _offset(token: Optional[str]) -> Optional[int]:
    if not token:
        return 0
    try:
        value = json.loads(base64.urlsafe_b64decode(token.encode()))["o"]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and value >= 0 else None
