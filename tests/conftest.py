"""Shared fixtures: the real stand-in servers, started as processes on loopback and stopped by PID."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from sandbox import processes


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    """One Azurite for the session (in memory). `.extra["connection_string"]` reaches it."""
    server = processes.start_azurite(log_dir=tmp_path_factory.mktemp("azurite"))
    yield server
    server.stop()


@pytest.fixture
def imds_server(tmp_path: Path) -> Iterator[processes.Server]:
    """A fresh IMDS simulator per test, time scale 60 (15 simulated minutes pass in 15 s)."""
    server = processes.start_imds(["--time-scale", "60"], log_dir=tmp_path)
    yield server
    server.stop()


@pytest.fixture
def eventhubs_server(tmp_path: Path) -> Iterator[processes.Server]:
    """A fresh Event Hubs AMQP server per test with hub `scheduled-events` of 4 partitions."""
    server = processes.start_eventhubs(log_dir=tmp_path)
    yield server
    server.stop()
