"""Shared by the fuzz tests: example counts (printed at the end by conftest.py) and the settings."""

from __future__ import annotations

import os
from collections import Counter
from typing import Dict

from hypothesis import HealthCheck, settings

COUNTS: Counter = Counter()
SECONDS: Dict[str, float] = {}

# CI-reproducible: derandomized (the same examples every run), no deadline (2 shared cores), no
# example database (nothing written in the repo). `FUZZ_SCALE` multiplies every example count
# (the `slow` variants use FUZZ_SLOW_FACTOR more).
SCALE = float(os.environ.get("FUZZ_SCALE", "1"))
SLOW_FACTOR = 10


def fuzz(max_examples: int) -> settings:
    return settings(max_examples=max(1, int(max_examples * SCALE)), derandomize=True, deadline=None,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example,
                                           HealthCheck.function_scoped_fixture])


def count(name: str, outcome: str) -> None:
    COUNTS[(name, outcome)] += 1
