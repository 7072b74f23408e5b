"""Prints how many examples each fuzz test actually ran, by outcome, and how long each took
(`FUZZ_COUNTS=path` also writes them there as JSON: the figures in docs/security.md)."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from typing import Any

import pytest

from .counting import COUNTS, SCALE, SECONDS


@pytest.fixture(autouse=True)
def _timed(request: pytest.FixtureRequest) -> Any:
    started = time.monotonic()
    yield
    SECONDS[request.node.name] = SECONDS.get(request.node.name, 0.0) + time.monotonic() - started


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not COUNTS:
        return
    tr = terminalreporter
    tr.section("fuzz examples run")
    totals: Counter = Counter()
    for (name, outcome), n in sorted(COUNTS.items()):
        tr.write_line(f"{name:40s} {outcome:28s} {n:7d}")
        totals[name] += n
    for name, n in sorted(totals.items()):
        tr.write_line(f"{name:40s} {'TOTAL':28s} {n:7d}")
    for name, secs in sorted(SECONDS.items()):
        tr.write_line(f"{name:69s} {secs:6.1f} s")
    path = os.environ.get("FUZZ_COUNTS")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"counts": {f"{k[0]}:{k[1]}": v for k, v in sorted(COUNTS.items())},
                       "totals": dict(totals), "seconds": SECONDS, "scale": SCALE}, fh, indent=2)
