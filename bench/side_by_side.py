"""Two plays of a benchmark at the same time, one of them in a process of its own, for a ratio of their CPU.

On this shared 2-core machine the CPU the same work takes drifts by up to ±20 % from one minute to the next,
on both cores alike (2026-11-26: the same 1-instance wave of bench.wave_sim took 1.18, 1.00 and 1.01 s of
CPU per 1,000 envelopes in three consecutive slots, while two copies played side by side in each slot agreed
within 3 %: 1.18 / 1.19, 1.00 / 1.00, 1.01 / 0.98). A ratio of two plays run one after the other measures
that drift as much as the code; two plays run side by side see the same machine. Each play must be one
busy thread (the machine has two cores), such as bench.wave_sim's virtual-time wave on the in-memory stand-in.
"""

from __future__ import annotations

import importlib
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Tuple, TypeVar

A = TypeVar("A")
B = TypeVar("B")


def _load(module: str) -> None:
    importlib.import_module(module)


def run(here: Callable[[], A], there: Callable[..., B], *args: Any) -> Tuple[A, B]:
    """(here(), there(*args)), the second in a spawned process (`there` and its arguments picklable; its
    module imported before either starts, so that both plays start together)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_load, there.__module__).result()
        other = pool.submit(there, *args)
        mine = here()
        return mine, other.result()
