"""Reading past scheduled events from Azure Resource Graph (`se-policy whatif --from-resource-graph`), through
azure-mgmt-resourcegraph with the operator's own Azure login. The only I/O of that path; the rows are turned
into history by central.cli.graph_rows (pure).

Login: azure-identity's DefaultAzureCredential, as `--table-endpoint` already uses: `az login` on a laptop,
the environment's service principal or workload identity in CI, a managed identity on an Azure VM, without
a flag per case. Reading needs the rows' read permission (the docs name Scheduled Events Contributor);
Resource Graph silently leaves out what the login cannot read.

Bounded: pages of PAGE_ROWS through skip tokens, `max_rows` in all (the read stops there and says so).
The endpoint is a setting (SE_RESOURCE_GRAPH_ENDPOINT / --resource-graph-endpoint; default Azure's ARM
endpoint) so the sandbox can point it at its loopback stand-in (sandbox/imds/resource_graph.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence
from urllib.parse import urlsplit

QUERY = ('maintenanceresources\n| where type == "microsoft.maintenance/scheduledevents"\n'
         "| project id, name, type, subscriptionId, resourceGroup, location, zones, properties\n"
         "| order by id asc")
DEFAULT_ENDPOINT = "https://management.azure.com"
PAGE_ROWS = 1000  # Resource Graph's largest page ($top at most 1000)
MAX_ROWS = 5000
ENDPOINT_ENV = "SE_RESOURCE_GRAPH_ENDPOINT"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class GraphError(Exception):
    """The read failed. `access`: the login or its rights (exit 5); else Resource Graph unreachable or
    its answer unreadable (exit 4). The message is one actionable line."""

    def __init__(self, message: str, access: bool) -> None:
        super().__init__(message)
        self.access = access


@dataclass
class GraphRead:
    rows: List[Dict[str, Any]] = field(default_factory=list)
    pages: int = 0
    total: Optional[int] = None  # Resource Graph's count of matching rows
    truncated: bool = False  # stopped at max_rows with more to read


def credential() -> Any:
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(exclude_interactive_browser_credential=True)


def read(cred: Any, subscriptions: Sequence[str], endpoint: str = DEFAULT_ENDPOINT,
         max_rows: int = MAX_ROWS, page_rows: int = PAGE_ROWS, query: str = QUERY,
         management_groups: Sequence[str] = ()) -> GraphRead:
    """Every row of `query` (default: the scheduled events) the login can read in `subscriptions` or
    `management_groups` (none: every subscription it can read), up to `max_rows`."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ServiceRequestError,
        ServiceResponseError,
    )
    from azure.mgmt.resourcegraph import ResourceGraphClient
    from azure.mgmt.resourcegraph.models import QueryRequest, QueryRequestOptions

    # plain HTTP only for a loopback stand-in: the SDK refuses a bearer token over HTTP otherwise
    host = urlsplit(endpoint).hostname or ""
    call: Dict[str, Any] = {"enforce_https": False} if endpoint.startswith("http://") and host in LOOPBACK \
        else {}
    out = GraphRead()
    token: Optional[str] = None
    with ResourceGraphClient(cred, base_url=endpoint.rstrip("/")) as client:
        while len(out.rows) < max_rows:
            top = min(page_rows, PAGE_ROWS, max_rows - len(out.rows))
            options = QueryRequestOptions(top=top, skip_token=token, result_format="objectArray")
            request = QueryRequest(query=query, subscriptions=list(subscriptions) or None,
                                   management_groups=list(management_groups) or None, options=options)
            try:
                page = client.resources(request, **call)
            except ClientAuthenticationError as exc:
                raise GraphError(_login_problem(exc), access=True) from None
            except HttpResponseError as exc:
                raise _refused(exc, subscriptions) from None
            except (ServiceRequestError, ServiceResponseError) as exc:
                raise GraphError(f"cannot reach Resource Graph at {endpoint}: {_first_line(exc)}",
                                 access=False) from None
            if not isinstance(page.data, list):
                raise GraphError("Resource Graph answered rows that are not a list", access=False)
            out.pages += 1
            out.total = page.total_records
            out.rows.extend(page.data)
            token = page.skip_token
            if not token:
                return out
        out.truncated = True
        return out


def _login_problem(exc: Exception) -> str:
    text = _first_line(exc)
    lowered = text.lower()
    if "credential" in lowered or "az login" in lowered or getattr(exc, "status_code", None) is None:
        return ("no Azure login for Resource Graph: run `az login` (or set AZURE_CLIENT_ID/AZURE_TENANT_ID "
                f"with a secret or federated token) and try again ({text[:160]})")
    return f"Resource Graph refused the login ({exc.status_code}): {text[:200]}; run `az login` again"


def _refused(exc: Any, subscriptions: Sequence[str]) -> GraphError:
    status = getattr(exc, "status_code", None)
    code = getattr(getattr(exc, "error", None), "code", None) or ""
    message = getattr(getattr(exc, "error", None), "message", None) or _first_line(exc)
    subs = ", ".join(subscriptions) or "every subscription of the login"
    if status in (401, 403):
        return GraphError(f"Resource Graph refused the login for {subs} ({status} {code}): {message[:200]}; "
                          "check --subscription, and that the login can read the VMs' scheduled events "
                          "(Scheduled Events Contributor or Reader)", access=True)
    if status == 400:
        return GraphError(f"Resource Graph refused the query for {subs} ({code}): {message[:200]}; check "
                          "--subscription (a subscription id the login can see: az account list -o table)",
                          access=True)
    return GraphError(f"Resource Graph answered {status} {code}: {message[:200]}", access=False)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
