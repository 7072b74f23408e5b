"""Central's own coverage read (issue 48): the VMs of COVERAGE_SCOPES from Azure Resource Graph, with the
Function app's identity, for the fleet view (GET /api/fleet "coverage"), counted as `se-fleet coverage`
counts them (central.policy.coverage: the same queries, rows, verdicts).

A plain REST call (POST {ARM_ENDPOINT}/providers/Microsoft.ResourceGraph/resources), as central.runtime.arm
is: the Function app ships no management SDK. Pages of 1000 through $skipToken, MAX_ROWS in all.

Cached per instance: one read at most every COVERAGE_REFRESH_SECONDS (default 300) whoever asks, and after
a failure not again for RETRY_SECONDS; requests in between get the last answer. A failure is an `error`
in the view beside the last good counts (if any), never an exception to the caller. The read runs outside
the service's lock: a slow Resource Graph delays only the fleet view that triggered it. A throttled page
(429) is asked again when Resource Graph's quota resets, if within THROTTLE_WAIT_MAX (THROTTLE_TRIES times).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import requests

from central.model.times import iso
from central.policy import coverage

from .arm import token_scope
from .settings import CentralSettings, arm_credential

API_VERSION = "2022-10-01"  # Microsoft.ResourceGraph resources, GA (the stand-in serves it)
PATH = "/providers/Microsoft.ResourceGraph/resources"
PAGE_ROWS = 1000  # Resource Graph's largest page
MAX_ROWS = 100_000  # inventory rows (VMs, their sets and extensions) read in all; more is an error
RETRY_SECONDS = 60.0
# Resource Graph's quota is per principal and short (e.g. 15 queries per 5 s): a throttled page is asked
# again once the quota resets (x-ms-user-quota-resets-after, else Retry-After), if that is soon, so a read
# of many pages is not thrown away for one 429; a longer wait ends the read (the next in RETRY_SECONDS).
THROTTLE_TRIES = 3
THROTTLE_WAIT_MAX = 10.0  # seconds
TIMEOUT = 15.0
USER_AGENT = "se-central-coverage"  # central's reads, told apart from operators' in the logs
GROUPS = "/providers/Microsoft.Management/managementGroups"


class CoverageError(Exception):
    """One line: why the read failed and what to do."""


@dataclass
class Inventory:
    """The last read: Resource Graph's rows as VMs (parsed once per read, not per view), or why none."""
    machines: List[coverage.Machine] = field(default_factory=list)
    role_scopes: List[str] = field(default_factory=list)
    read_at: Optional[datetime] = None  # the last good read
    error: str = ""  # the last read's failure ("" when it succeeded)


class CoverageReader:
    def __init__(self, credential: Callable[[], Any], endpoint: str, subscriptions: Sequence[str],
                 management_groups: Sequence[str], principal_id: str, refresh: float,
                 tag: str = "se-forwarder", session: Optional[requests.Session] = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._credential_factory = credential  # built on first read: no identity call at start-up
        self._credential: Any = None
        self.endpoint = endpoint.rstrip("/")
        self.subscriptions, self.management_groups = list(subscriptions), list(management_groups)
        self.principal_id = principal_id
        self.refresh = refresh
        self.tag = tag
        self.session = session or requests.Session()
        self.clock, self.sleep = clock, sleep
        self._lock = threading.Lock()
        self._next = 0.0  # monotonic time of the next read
        self.inventory = Inventory()
        self.reads = 0

    def get(self, now: datetime) -> Inventory:
        """The cached inventory, read again first when it is older than `refresh` (one reader at a time;
        the others wait for its answer rather than read too)."""
        with self._lock:
            if self.clock() >= self._next:
                self.reads += 1
                try:
                    rows = self._read(coverage.inventory_query(), MAX_ROWS)
                    roles = self._read(coverage.role_query(self.principal_id), MAX_ROWS) \
                        if self.principal_id else []
                    self.inventory = Inventory(_parsed(rows, self.tag), coverage.role_scopes(roles), now)
                    self._next = self.clock() + self.refresh
                except CoverageError as exc:
                    old = self.inventory
                    self.inventory = Inventory(old.machines, old.role_scopes, old.read_at, str(exc))
                    self._next = self.clock() + min(self.refresh, RETRY_SECONDS)
            return self.inventory

    def _token(self) -> str:
        try:
            if self._credential is None:
                self._credential = self._credential_factory()
            return str(self._credential.get_token(token_scope(self.endpoint)).token)
        except Exception as exc:  # noqa: BLE001 - azure-identity raises its own types; shown in the view
            raise CoverageError(f"no ARM token for central's identity: {type(exc).__name__}: "
                                f"{str(exc)[:200]}") from None

    def _read(self, query: str, max_rows: int) -> List[Dict[str, Any]]:
        rows: List[Dict[str, Any]] = []
        skip: Optional[str] = None
        token = self._token()
        while True:
            options: Dict[str, Any] = {"$top": PAGE_ROWS, "resultFormat": "objectArray"}
            if skip:
                options["$skipToken"] = skip
            body: Dict[str, Any] = {"query": query, "options": options}
            if self.subscriptions:
                body["subscriptions"] = self.subscriptions
            if self.management_groups:
                body["managementGroups"] = self.management_groups
            page = self._post(body, token)
            data = page.get("data")
            if not isinstance(data, list):
                raise CoverageError("Resource Graph answered rows that are not a list")
            rows.extend(r for r in data if isinstance(r, dict))
            skip = page.get("$skipToken")
            if not skip:
                return rows
            if len(rows) >= max_rows:
                raise CoverageError(f"more than {max_rows} Resource Graph rows in COVERAGE_SCOPES: narrow it "
                                    "and use `se-fleet coverage --resource-group` for the rest")

    def _post(self, body: Dict[str, Any], token: str) -> Dict[str, Any]:
        for attempt in range(1, THROTTLE_TRIES + 1):
            response = self._send(body, token)
            wait = throttle_wait(response.headers) if response.status_code == 429 else None
            if wait is None or wait > THROTTLE_WAIT_MAX or attempt == THROTTLE_TRIES:
                break
            self.sleep(wait)
        return self._answer(response)

    def _send(self, body: Dict[str, Any], token: str) -> requests.Response:
        try:
            return self.session.post(f"{self.endpoint}{PATH}", params={"api-version": API_VERSION},
                                     json=body, timeout=TIMEOUT,
                                     headers={"Authorization": f"Bearer {token}", "User-Agent": USER_AGENT})
        except requests.RequestException as exc:
            raise CoverageError(f"cannot reach Resource Graph at {self.endpoint}: "
                                f"{type(exc).__name__}: {str(exc)[:200]}") from None

    def _answer(self, response: requests.Response) -> Dict[str, Any]:
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if response.status_code != 200 or not isinstance(doc, dict):
            error = (doc or {}).get("error") if isinstance(doc, dict) else None
            code = str((error or {}).get("code") or "")
            message = str((error or {}).get("message") or response.text[:200])[:300]
            hint = ": central's identity needs Reader on every COVERAGE_SCOPES scope (docs/deploy.md, " \
                   "\"Cover a whole subscription\")" if response.status_code in (401, 403) else ""
            if response.status_code == 429:
                hint = (f": central's reads are throttled (quota resets after "
                        f"{response.headers.get('x-ms-user-quota-resets-after') or '?'}); read again within "
                        f"{RETRY_SECONDS:.0f} s")
            raise CoverageError(f"Resource Graph answered {response.status_code} {code} {message}{hint}")
        return doc


def throttle_wait(headers: Mapping[str, str]) -> Optional[float]:
    """Seconds until Resource Graph's quota resets: x-ms-user-quota-resets-after (hh:mm:ss), else
    Retry-After (seconds); None when neither says."""
    resets = str(headers.get("x-ms-user-quota-resets-after") or "")
    parts = resets.split(":")
    if len(parts) == 3 and all(p.strip().isdigit() for p in parts):
        hours, minutes, seconds = (int(p) for p in parts)
        return float(hours * 3600 + minutes * 60 + seconds)
    retry_after = str(headers.get("Retry-After") or "").strip()
    return float(retry_after) if retry_after.isdigit() else None


def _parsed(rows: List[Dict[str, Any]], tag: str) -> List[coverage.Machine]:
    try:
        return coverage.machines(rows, tag)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a row not in the queries' shape
        raise CoverageError(f"Resource Graph's rows are not in the inventory query's shape: "
                            f"{type(exc).__name__}: {str(exc)[:200]}") from None


def coverage_reader(typed: CentralSettings, settings: Mapping[str, str]) -> Optional[CoverageReader]:
    """The reader COVERAGE_SCOPES asks for, with the Function app's ARM identity and ARM_ENDPOINT."""
    subscriptions, groups = typed.coverage_scopes
    if not subscriptions and not groups:
        return None
    session = requests.Session()
    session.trust_env = not typed.arm_endpoint.startswith("http://")  # a loopback stand-in: no proxy
    return CoverageReader(lambda: arm_credential(settings), typed.arm_endpoint, subscriptions, groups,
                          typed.coverage_principal_id, typed.coverage_refresh, typed.coverage_tag, session)


def section(reader: Optional[CoverageReader], fleet: Dict[str, Any], now: datetime) -> Dict[str, Any]:
    """The fleet view's "coverage": counts by verdict, subscription and resource group (as `se-fleet
    coverage --json`), or why there are none."""
    if reader is None:
        return {"configured": False,
                "note": "COVERAGE_SCOPES is empty: central does not read Resource Graph "
                        "(se-fleet coverage reads it with your login)"}
    inventory = reader.get(now)
    out: Dict[str, Any] = {
        "configured": True,
        "scopes": [*(f"/subscriptions/{s}" for s in reader.subscriptions),
                   *(f"{GROUPS}/{g}" for g in reader.management_groups)],
        "readAt": iso(inventory.read_at) if inventory.read_at else None,
        "refreshSeconds": reader.refresh,
        "error": inventory.error or None,
        "agentlessRead": bool(reader.principal_id),
    }
    if inventory.read_at is not None:  # counts of the last good read, even beside a newer failure
        out.update(coverage.fleet_counts(inventory.machines, inventory.role_scopes, fleet))
    return out
