"""Central's coverage read (issue 48, central/runtime/coverage_read.py): what one Resource Graph read of a
large scope costs the instance that makes it, and what a cached fleet view costs after it.

    python -m bench.fleet_coverage [--vms 20000]

The Resource Graph stand-in (sandbox/inventory_graph.py, real HTTP) serves a subscription of N VMs, each
with the forwarder's extension row (2N inventory rows: pages of 1000 through $skipToken), and central's role
on one resource group; the ARM token comes from the IMDS simulator's managed-identity endpoint
(azure-identity), as in Azure. Central's fleet knows half of the VMs. Figures, each the median of 3 runs:
- read: a cold CoverageReader.get (every page of the inventory and the role query, parsed into VMs);
- count: central.policy.coverage.fleet_counts over those VMs and the fleet (what every fleet view computes);
- cached: the fleet view's coverage section once the read is cached (no Resource Graph call).
Goals: the read within 30 s for 20,000 VMs (every COVERAGE_REFRESH_SECONDS, default 300, per instance);
a cached section within 0.5 s (it runs on every GET /api/fleet).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional

from bench import Figure, record, spread_figure
from central.policy import coverage
from central.runtime import coverage_read
from sandbox import processes

REPEATS_INSIDE = True
SUB = "0b5f2a9e-6c1d-4e8f-9a7b-3c2d1e0f4a5b"
CENTRAL = "7d3c9a1e-2b4f-4c6d-8e0a-1f2b3c4d5e6f"
RUNS = 3


def world(vms: int) -> Dict[str, Any]:
    resources: List[Dict[str, Any]] = []
    for i in range(vms):
        group = f"rg-{i % 20:02d}"
        vm = f"/subscriptions/{SUB}/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/" \
             f"vm-{i:06d}"
        resources.append({"id": vm, "name": f"vm-{i:06d}", "type": coverage.VM_TYPE, "subscriptionId": SUB,
                          "resourceGroup": group, "tags": {}, "vmId": f"00000000-0000-4000-8000-{i:012d}",
                          "owner": "", "feed": i % 3 == 0})
        resources.append({"id": f"{vm}/extensions/{coverage.EXTENSION_PREFIX}-linux",
                          "type": coverage.EXTENSION_TYPE, "name": f"{coverage.EXTENSION_PREFIX}-linux",
                          "subscriptionId": SUB,
                          "resourceGroup": group, "provisioningState": "Succeeded"})
    role = {"id": f"/subscriptions/{SUB}/providers/Microsoft.Authorization/roleAssignments/0",
            "subscriptionId": SUB, "principalId": CENTRAL,
            "scope": f"/subscriptions/{SUB}/resourceGroups/rg-00"}
    return {"resources": resources, "computeresources": [], "authorizationresources": [role]}


def fleet(vms: int) -> Dict[str, Any]:
    return {"vms": [{"vmId": f"00000000-0000-4000-8000-{i:012d}", "silent": i % 4 == 0}
                    for i in range(0, vms, 2)]}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_coverage", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vms", type=int, default=20_000)
    args = parser.parse_args(argv)
    from azure.identity import DefaultAzureCredential

    reads: List[float] = []
    counts: List[float] = []
    cached: List[float] = []
    known = fleet(args.vms)
    with tempfile.TemporaryDirectory(prefix="bench-coverage-") as tmp:
        work = Path(tmp)
        (work / "world.json").write_text(json.dumps(world(args.vms)))
        imds = processes.start_imds(["--rate-limit", "0"], log_dir=work)
        port = processes.free_port()
        graph = processes.start("inventory-graph", [sys.executable, "-m", "sandbox.inventory_graph", "--port",
                                                   str(port), "--world", str(work / "world.json")],
                                {"http": port}, log_dir=work)
        os.environ["AZURE_POD_IDENTITY_AUTHORITY_HOST"] = f"http://127.0.0.1:{imds.port}"
        try:
            for _ in range(RUNS):
                reader = coverage_read.CoverageReader(
                    lambda: DefaultAzureCredential(exclude_interactive_browser_credential=True),
                    f"http://127.0.0.1:{port}", (SUB,), (), CENTRAL, 300.0)
                now = datetime.now(timezone.utc)
                start = time.perf_counter()
                inventory = reader.get(now)
                reads.append(time.perf_counter() - start)
                if inventory.error:
                    print(f"read failed: {inventory.error}", file=sys.stderr)
                    return 1
                start = time.perf_counter()
                summary = coverage.fleet_counts(inventory.machines, inventory.role_scopes, known)
                counts.append(time.perf_counter() - start)
                start = time.perf_counter()
                section = coverage_read.section(reader, known, now)
                cached.append(time.perf_counter() - start)
                assert section["vms"] == summary["vms"] == args.vms and reader.reads == 1
        finally:
            graph.stop()
            imds.stop()
    figures = [
        spread_figure(Figure("fleet_coverage", f"cold read of {args.vms} VMs ({2 * args.vms} rows)", 0, "s",
                             "<= 30"), reads),
        spread_figure(Figure("fleet_coverage", f"verdicts and counts of {args.vms} VMs", 0, "s"), counts),
        spread_figure(Figure("fleet_coverage", "cached coverage section (a fleet view)", 0, "s", "<= 0.5"),
                      cached),
    ]
    for f in figures:
        print(f"{f.name}: median {f.value:.3f} {f.unit} [{f.low:.3f}-{f.high:.3f}] over {f.runs} runs"
              + (f" (goal {f.goal})" if f.goal else ""))
    record(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
