"""Fixtures: one IMDS simulator per module (reset before each test) with two VMs, Azurite for the session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from sandbox import processes
from sandbox.imds.client import ImdsSimulator

from .helpers import TIME_SCALE, VM0, VM1, Rig, make_rig


@pytest.fixture(scope="module")
def imds_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[processes.Server]:
    args = ["--time-scale", TIME_SCALE, "--vm", json.dumps(VM0), "--vm", json.dumps(VM1)]
    server = processes.start_imds(args, log_dir=tmp_path_factory.mktemp("imds"))
    yield server
    server.stop()


@pytest.fixture
def sim(imds_sim: processes.Server) -> Iterator[ImdsSimulator]:
    client = ImdsSimulator(f"http://127.0.0.1:{imds_sim.port}")
    client.reset()
    yield client
    client.close()


@pytest.fixture
def rig(sim: ImdsSimulator, azurite: processes.Server, tmp_path: Path) -> Iterator[Rig]:
    r = make_rig(sim.base_url, azurite.extra["connection_string"], tmp_path)
    yield r
    r.service.close()
    r.queue.close()
    r.outbox.close()
    r.imds.close()
