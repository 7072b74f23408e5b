"""Approving through ARM (issue 23, point 3): the Microsoft.Maintenance acknowledge API, a plain REST call
with the Function app's managed identity (azure-identity), no SDK.

Why REST: azure-mgmt-maintenance has scheduled events only in its 2.2.0 betas, and their generated code
accepts HTTP 200 alone, so the list call's 207 (partial results) raises there. Here:
- single: POST {arm}/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/{kind}/{name}
  /providers/Microsoft.Maintenance/scheduledevents/{id}/acknowledge?api-version=V (no body; 200 {"value"});
- list: POST .../providers/Microsoft.Maintenance/scheduledevents?api-version=V, body {"value": [ids]}:
  200 for all, or 207 with per-event results in a shape the spec does not document:
  {"response": {code, message}, "details": [{target, code, message}]}, `target` possibly empty (then the
  details are in request order). Both shapes, and the swagger's error form, are read;
- 429 (and 503) with Retry-After: honoured, waiting up to `max_wait` in all before giving up with the time
  the caller may try again;
- `kind` is the Compute resource that owns the event: virtualMachines, virtualMachineScaleSets or
  availabilitySets (the owner in the platform event's data.resourceInfo.id).

api-version: ARM_API_VERSION, default 2025-11-01, the stable Maintenance version that has both single and
list acknowledge (the docs and the CLI still use 2025-10-01-preview; the project keeps previews out of what it
deploys, and a setting lets an operator switch while a region lags). Endpoint: ARM_ENDPOINT (default
https://management.azure.com; the sandbox points it at its stand-in).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence
from urllib.parse import quote

import requests

from central.model.owner import Owner

DEFAULT_ENDPOINT = "https://management.azure.com"
DEFAULT_API_VERSION = "2025-11-01"
SCOPE = "https://management.azure.com/.default"
TIMEOUT = 15.0
MAX_WAIT = 30.0  # seconds spent in Retry-After waits per call, at most
# a 207's per-event codes that mean "try again", as the HTTP status the whole call would have had
RETRY_CODES = {"toomanyrequests": 429, "throttled": 429, "requesttimeout": 408, "internalservererror": 500,
               "serviceunavailable": 503, "gatewaytimeout": 504}


def token_scope(endpoint: str) -> str:
    """The token's audience is the cloud's ARM (management.usgovcloudapi.net, ...); a local stand-in (http)
    takes public ARM's, as its tokens say."""
    endpoint = endpoint.rstrip("/")
    public = endpoint.startswith("http://") or endpoint == DEFAULT_ENDPOINT
    return SCOPE if public else f"{endpoint}/.default"


@dataclass(frozen=True)
class Ack:
    """What ARM said about one event."""

    event_id: str
    ok: bool
    status: int  # the HTTP status of the call (207 for a per-event result of a partial list call)
    code: str = ""
    message: str = ""
    retry_after: Optional[float] = None  # throttled: seconds after which to try again


class ArmError(RuntimeError):
    """The call could not be made (no token, no connection)."""


class ArmAcknowledger:
    def __init__(self, credential: Any, endpoint: str = DEFAULT_ENDPOINT,
                 api_version: str = DEFAULT_API_VERSION, session: Optional[requests.Session] = None,
                 max_wait: float = MAX_WAIT,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.credential = credential
        self.endpoint = endpoint.rstrip("/")
        self.api_version = api_version
        self.session = session or requests.Session()
        self.max_wait = max_wait
        self.sleep = sleep
        self.scope = token_scope(self.endpoint)

    def acknowledge(self, target: Owner, event_ids: Sequence[str]) -> List[Ack]:
        """Approve these events of one owner (one call: single for one id, list for more)."""
        ids = list(dict.fromkeys(event_ids))
        if not ids:
            return []
        base = self.endpoint + target.path()
        if len(ids) == 1:
            url, body = f"{base}/{quote(ids[0])}/acknowledge", None
        else:
            url, body = base, {"value": ids}
        response = self._post(url, body)
        return read(response.status_code, _json(response), ids, _retry_after(response))

    def _post(self, url: str, body: Optional[Dict[str, Any]]) -> requests.Response:
        waited = 0.0
        while True:
            try:
                token = self.credential.get_token(self.scope).token
            except Exception as exc:  # noqa: BLE001 - azure-identity raises its own types; the caller alerts
                raise ArmError(f"no ARM token: {type(exc).__name__}: {str(exc)[:300]}") from None
            try:
                response = self.session.post(url, params={"api-version": self.api_version}, json=body,
                                             headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)
            except requests.RequestException as exc:
                raise ArmError(f"ARM unreachable: {type(exc).__name__}: {str(exc)[:300]}") from None
            wait = _retry_after(response)
            if response.status_code not in (429, 503) or wait is None or waited + wait > self.max_wait:
                return response
            self.sleep(wait)
            waited += wait


def read(status: int, doc: Any, ids: Sequence[str], retry_after: Optional[float] = None) -> List[Ack]:
    """The per-event results of an acknowledge call (pure): 200 all approved; 207 per `details`; any other
    status the same error for all."""
    if status == 200:
        return [Ack(i, True, status, "", str((doc or {}).get("value", ""))[:200]) for i in ids]
    if status == 207 and isinstance(doc, dict):
        details = doc.get("details")
        if not isinstance(details, list):
            details = ((doc.get("error") or {}).get("details")) or []
        by_target: Dict[str, Dict[str, Any]] = {}
        unnamed: List[Dict[str, Any]] = []
        for d in details:
            if isinstance(d, dict):
                # an EventId is a GUID (any case); a target may also be the event's resource id
                target = str(d.get("target") or "").rstrip("/").rsplit("/", 1)[-1].lower()
                (by_target.__setitem__(target, d) if target else unnamed.append(d))
        out = []
        for i, event_id in enumerate(ids):
            d = by_target.get(event_id.lower()) or (unnamed[i] if i < len(unnamed) else None)
            if d is None:  # not named as failed: approved
                out.append(Ack(event_id, True, status))
                continue
            code = str(d.get("code") or "")
            ok = code.lower() in ("", "ok", "success", "succeeded", "approved", "200")
            again = RETRY_CODES.get(code.lower())  # throttled or failing inside: the call's own status
            out.append(Ack(event_id, ok, again or status, code, str(d.get("message") or "")[:500],
                           retry_after if again in (429, 503) else None))
        return out
    error = (doc or {}).get("error") if isinstance(doc, dict) else None
    code = str((error or {}).get("code") or f"HTTP{status}")
    message = str((error or {}).get("message") or "")[:500]
    return [Ack(i, False, status, code, message, retry_after if status in (429, 503) else None) for i in ids]


def _json(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _retry_after(response: requests.Response) -> Optional[float]:
    text = response.headers.get("Retry-After")
    if text is None:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        return None
