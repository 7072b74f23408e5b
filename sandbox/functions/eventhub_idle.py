"""The runner's Event Hubs consumers wait, instead of spinning, while they own no partition.

azure-eventhub's sync `EventProcessor.start` (5.15, `_eventprocessor/event_processor.py`) loops
`while self._running: for partition_id, consumer in list(self._consumers.items()): ...`. With no partition
owned, which is the case of every runner but one on the platform hub (1 partition) and of any runner
beyond a hub's partition count, that loop never blocks and holds the GIL. Measured (bench.fleet_scale,
1,000 VMs): the runners' idle background CPU was 0.007 CPU s/s on 1 runner and 1.97 CPU s/s on 4, on a
2-core machine, which is also where the 4 runners' invocations ran. The Functions host runs the .NET
Event Hubs extension, not this Python loop, so the sandbox should not spin either.

The one private name used is `EventProcessor._consumers` (the dict that loop reads): its `items()` waits
IDLE_POLL when it is empty, so a processor with nothing to read polls 20 times a second and reads a
partition it is given within 50 ms. tests/functions/test_runner_eventhubs.py fails when the SDK changes
under it (the loop, or the attribute).
"""

from __future__ import annotations

import time
from typing import Any

from azure.eventhub._eventprocessor import event_processor

IDLE_POLL = 0.05  # seconds


class _Consumers(dict):  # type: ignore[type-arg]
    """EventProcessor._consumers: a dict whose items() waits a little while it is empty."""

    def items(self) -> Any:
        if not self:
            time.sleep(IDLE_POLL)
        return super().items()


def install() -> None:
    """Make every EventProcessor created from now on wait while it owns no partition (idempotent)."""
    cls: Any = event_processor.EventProcessor
    if getattr(cls, "_sandbox_waits_idle", False):
        return
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._consumers = _Consumers(self._consumers)

    cls.__init__ = __init__
    cls._sandbox_waits_idle = True
