"""What the sandbox runner's records say about central's invocations, for the benches that count envelopes
through the whole pipeline (bench.fleet_scale, bench.fleet_units): the ingest function's batches, the
commits that lost a race, the CPU inside the invocations.

Counted from the runner's own lines, the host's "Executing" (its Reason names the batch's size) and
"Executed ... Succeeded": central's per-batch summary is a Debug line when the batch is routine
(function_app.py), so it is not written where the benches read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List

EXECUTING = re.compile(
    r"Executing 'Functions\.ingest' \(Reason='[^']*\bevents=(\d+)\b[^']*', Id=([0-9a-f-]+)\)")
SUCCEEDED = re.compile(r"Executed 'Functions\.ingest' \(Succeeded, Id=([0-9a-f-]+),")
LOST_RACE = re.compile(r"lost a race")  # central's log line for each commit that lost to another instance


def ingested(text: str) -> int:
    """Envelopes in the ingest executions that succeeded (a retried batch counts once)."""
    sizes: Dict[str, int] = {invocation: int(n) for n, invocation in EXECUTING.findall(text)}
    return sum(sizes.get(invocation, 0) for invocation in set(SUCCEEDED.findall(text)))


def lost_races(text: str) -> int:
    return len(LOST_RACE.findall(text))


def invocation_cpu(files: List[Path]) -> float:
    """CPU seconds spent inside central's function invocations so far, all instances (the runner keeps
    the totals: sandbox.functions.loader.CPU_FILE_SETTING)."""
    total = 0.0
    for path in files:
        if path.exists():
            total += sum(float(v) for v in json.loads(path.read_text(encoding="utf-8")).values())
    return total
