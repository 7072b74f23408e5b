"""What the sandbox runner's log says about the ingest function's batches, for the benches that count
envelopes through the whole pipeline (bench.fleet_scale, bench.fleet_units).

Counted from the runner's own lines, the host's "Executing" (its Reason names the batch's size) and
"Executed ... Succeeded": central's per-batch summary is a Debug line when the batch is routine
(function_app.py), so it is not written where the benches read.
"""

from __future__ import annotations

import re
from typing import Dict

EXECUTING = re.compile(
    r"Executing 'Functions\.ingest' \(Reason='[^']*\bevents=(\d+)\b[^']*', Id=([0-9a-f-]+)\)")
SUCCEEDED = re.compile(r"Executed 'Functions\.ingest' \(Succeeded, Id=([0-9a-f-]+),")


def ingested(text: str) -> int:
    """Envelopes in the ingest executions that succeeded (a retried batch counts once)."""
    sizes: Dict[str, int] = {invocation: int(n) for n, invocation in EXECUTING.findall(text)}
    return sum(sizes.get(invocation, 0) for invocation in set(SUCCEEDED.findall(text)))
