"""One way to run the IMDS simulator for a test module: started by PID, reached by its admin client."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from sandbox import processes
from sandbox.imds.client import ImdsSimulator


def running(args: Sequence[str], log_dir: Path) -> Iterator[ImdsSimulator]:
    """Yield a client of a simulator started with `args`; stop the simulator afterwards."""
    server = processes.start_imds(list(args), log_dir=log_dir)
    client = ImdsSimulator(f"http://{processes.LOOPBACK}:{server.port}")
    try:
        yield client
    finally:
        client.close()
        server.stop()
