"""Fixtures for the Event Hubs sink tests: the IMDS simulator with two VMs, and Event Hubs servers."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from sandbox import processes


@pytest.fixture
def imds2(tmp_path: Path) -> Iterator[processes.Server]:
    """A fresh IMDS simulator per test with VMs vm0 and vm1, time scale 60."""
    server = processes.start_imds(["--time-scale", "60", "--vm", "vm0", "--vm", "vm1"], log_dir=tmp_path)
    yield server
    server.stop()
