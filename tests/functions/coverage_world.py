"""The coverage tests' world (issue 48): a subscription with VMs of every kind, a Uniform scale set, an
availability of the platform feed, a bulk group of more than two Resource Graph pages, a VM in another
subscription behind a management group, and central's role assignments, as the Resource Graph stand-in
(sandbox/inventory_graph.py) serves them; and the stack that serves it (coverage_stack, the `coverage_env`
fixture in conftest.py). Shared by `se-fleet coverage`'s tests and central's fleet view's."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from central.cli import resource_graph
from sandbox import processes
from sandbox.functions.issuer import LocalIssuer
from tests import signing
from tests.central.factory import Vm, body

from .conftest import RunnerFiles, central_backends, start_runner

SUB = "0b5f2a9e-6c1d-4e8f-9a7b-3c2d1e0f4a5b"
SUB_B = "5e4d3c2b-1a09-4f8e-9d7c-6b5a4f3e2d1c"
CENTRAL = "7d3c9a1e-2b4f-4c6d-8e0a-1f2b3c4d5e6f"
SEC = "/providers/Microsoft.Authorization/roleDefinitions/b67fe603-310e-4889-b9ee-8257d09d353d"
BULK = 2300  # more than two pages of 1000
HEARD, QUIET, WEB0 = Vm("heard"), Vm("quiet"), Vm("web_0", scale_set="web")
LATE = Vm("late-1")


def _rg(sub: str, group: str) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{group}/providers/Microsoft.Compute"


def vm_row(name: str, vm_id: str, group: str = "apps", sub: str = SUB, **extra: Any) -> Dict[str, Any]:
    return {"id": f"{_rg(sub, group)}/virtualMachines/{name}", "name": name,
            "type": "microsoft.compute/virtualmachines", "subscriptionId": sub, "resourceGroup": group,
            "tags": extra.pop("tags", {}), "vmId": vm_id, "owner": "", "feed": None, **extra}


def extension_row(name: str, group: str = "apps") -> Dict[str, Any]:
    return {"id": f"{_rg(SUB, group)}/virtualMachines/{name}/extensions/se-forwarder-install-linux",
            "name": "se-forwarder-install-linux", "type": "microsoft.compute/virtualmachines/extensions",
            "subscriptionId": SUB, "resourceGroup": group, "provisioningState": "Succeeded"}


def world(late: Tuple[Dict[str, Any], ...] = ()) -> Dict[str, Any]:
    resources = [
        vm_row("heard", HEARD.vm_id), extension_row("heard"),
        vm_row("quiet", QUIET.vm_id), extension_row("quiet"),
        vm_row("nothing", "6f1e2d3c-0000-4000-8000-00000000000a"),
        vm_row("opted", "6f1e2d3c-0000-4000-8000-00000000000b", feed=True),
        vm_row("off", "6f1e2d3c-0000-4000-8000-00000000000c", tags={"se-forwarder": "off"}),
        {"id": f"{_rg(SUB, 'apps')}/virtualMachineScaleSets/web", "name": "web", "subscriptionId": SUB,
         "type": "microsoft.compute/virtualmachinescalesets", "resourceGroup": "apps", "tags": {},
         "orchestrationMode": "Uniform", "extensions": [{"name": "se-forwarder-install-linux"}]},
        *[vm_row(f"bulk-{i:04d}", f"9a8b7c6d-0000-4000-8000-{i:012d}", group="bulk", feed=True)
          for i in range(BULK)],
        vm_row("far", "6f1e2d3c-0000-4000-8000-00000000000d", group="other", sub=SUB_B),
        *late,
    ]
    web = f"{_rg(SUB, 'apps')}/virtualMachineScaleSets/web"
    instances = [{"id": f"{web}/virtualMachines/{n}", "name": f"web_{n}",
                  "type": "microsoft.compute/virtualmachinescalesets/virtualmachines", "subscriptionId": SUB,
                  "resourceGroup": "apps", "tags": {}, "vmId": vm_id}
                 for n, vm_id in enumerate((WEB0.vm_id, "6f1e2d3c-0000-4000-8000-00000000000e"))]
    roles = [{"id": f"/subscriptions/{SUB}/providers/Microsoft.Authorization/roleAssignments/{n}",
              "subscriptionId": SUB, "principalId": CENTRAL, "roleDefinitionId": SEC, "scope": scope}
             for n, scope in enumerate((f"{_rg(SUB, 'apps')}/virtualMachines/opted",
                                        f"/subscriptions/{SUB}/resourceGroups/bulk"))]
    return {"resources": resources, "computeresources": instances, "authorizationresources": roles,
            "managementGroups": {"mg-b": [SUB_B]}}


@contextmanager
def coverage_stack(work: Path) -> Iterator[Dict[str, Any]]:
    """Central (the Functions runner on Azurite) that knows three forwarders, the IMDS simulator's managed
    identity, and the Resource Graph stand-in serving world(). Central reads the stand-in itself
    (COVERAGE_SCOPES: SUB, its identity CENTRAL, a 1 s refresh so a test sees a world it just wrote);
    this process's azure-identity reads it too (for `se-fleet coverage`), through the same IMDS."""
    now = datetime.now(timezone.utc)  # the live VMs must be within the liveness window when asked
    imds = processes.start_imds(["--rate-limit", "0"], log_dir=work)
    port = processes.free_port()
    (work / "world.json").write_text(json.dumps(world()))
    graph = processes.start("inventory-graph", [sys.executable, "-m", "sandbox.inventory_graph", "--port",
                                               str(port), "--world", str(work / "world.json")],
                            {"http": port}, log_dir=work)
    identity = {"AZURE_POD_IDENTITY_AUTHORITY_HOST": f"http://127.0.0.1:{imds.port}"}
    names = (*identity, resource_graph.ENDPOINT_ENV)
    saved = {k: os.environ.get(k) for k in names}
    runner = None
    try:
        with central_backends(work, "coverage", "coverage") as values:
            svc = signing.central(values)
            hour_ago = now - timedelta(hours=1)
            svc.handle_batch([body(QUIET.heartbeat(at=hour_ago))], now=hour_ago)
            svc.handle_batch([body(HEARD.heartbeat(at=now)), body(WEB0.heartbeat(at=now))], now=now)
            issuer = LocalIssuer(work / "issuer").init()
            files = RunnerFiles(work / "central")
            files.write({**values, **identity, **central_coverage(f"http://127.0.0.1:{port}")},
                        keys={"host": {"default": "coverage-key"}}, auth=issuer.auth_section())
            runner = start_runner(files, "function_app")
            os.environ.update(identity)
            os.environ[resource_graph.ENDPOINT_ENV] = f"http://127.0.0.1:{port}"
            yield {"svc": svc, "url": f"http://{processes.LOOPBACK}:{runner.port}", "graph": port,
                   "token": issuer.token("rita@contoso.com", ["Reader"])}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for server in (runner, graph, imds):
            if server is not None:
                server.stop()


def central_coverage(endpoint: str) -> Dict[str, str]:
    """Central's coverage settings for the stand-in."""
    return {"COVERAGE_SCOPES": f"/subscriptions/{SUB}", "COVERAGE_PRINCIPAL_ID": CENTRAL,
            "COVERAGE_REFRESH_SECONDS": "1", "ARM_ENDPOINT": endpoint}


def admin(env: Dict[str, Any], path: str, payload: Optional[Any] = None) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{env['graph']}/admin/{path}",
                                     method="POST" if payload is not None else "GET",
                                     data=json.dumps(payload).encode() if payload is not None else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


