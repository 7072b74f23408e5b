"""Re-verification after a trust repair (issue 22, point 2): kept trust-refused envelopes re-verified as of
their receive time and applied through ingest, per second, by one central instance on Azurite. Heartbeats
(applied together, ingest segments them) and incarnations (applied one at a time, so a superseded one is
told apart) are measured apart. Signed with the simulator's test PKI; 3 runs, median and range.

    python -m bench.reverify_rate
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Dict, List

from bench import Figure, record, spread_figure
from central.runtime.service import CentralService
from sandbox import processes
from sandbox.imds.signer import Signer
from tests.central.factory import T0, Vm, body

REPEATS_INSIDE = True
RUNS = 3
VMS = 50
SIGNER = Signer(timeless=True)


def one_run(connection: str, kind: str, per_vm: int) -> float:
    settings = {"ApprovalStorage": connection, "TABLE_PREFIX": "rv" + uuid.uuid4().hex[:10],
                "ALERT_WEBHOOK_URL": "", "ALERT_WEBHOOK_FORMAT": "generic"}
    broken = CentralService.from_settings(settings)  # the defaults: the test CA is unknown
    vms = [Vm(f"vm{i}") for i in range(VMS)]
    for k in range(per_vm):
        at = T0 + timedelta(seconds=30 * k)
        envs = [v.heartbeat(at=at) if kind == "heartbeat" else v.incarnation_env([], at=at) for v in vms]
        bodies = [body(e) for e in envs]
        broken.handle_batch(bodies, now=at, properties=SIGNER.as_claimed(bodies))
    repaired = CentralService.from_settings({**settings, "AUTHN_TRUST_PEM": SIGNER.trust_pem})
    start = time.perf_counter()
    answer = repaired.reverify(now=T0 + timedelta(minutes=30))
    seconds = time.perf_counter() - start
    if answer["outcomes"].get("applied") != VMS * per_vm:
        raise SystemExit(f"reverify applied {answer['outcomes']}, want {VMS * per_vm}")
    return VMS * per_vm / seconds


def main(argv: List[str]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        azurite = processes.start_azurite(log_dir=Path(tmp))
        try:
            found: Dict[str, List[float]] = {"heartbeat": [], "incarnation": []}
            for run in range(RUNS):
                found["heartbeat"].append(one_run(azurite.extra["connection_string"], "heartbeat", 10))
                found["incarnation"].append(one_run(azurite.extra["connection_string"], "incarnation", 4))
                print(f"run {run + 1}: heartbeats {found['heartbeat'][-1]:.0f}/s, incarnations "
                      f"{found['incarnation'][-1]:.0f}/s", flush=True)
        finally:
            azurite.stop()
    figures = []
    for kind, rates in found.items():
        name = f"kept {kind}s re-verified and applied"
        figure = spread_figure(Figure("reverify_rate", name, 0.0, "/s"), rates)
        figures.append(figure)
        print(f"{figure.name}: {statistics.median(rates):.0f}/s [{figure.low:.0f}-{figure.high:.0f}]")
    record(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
