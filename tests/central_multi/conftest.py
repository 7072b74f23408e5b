"""Several central instances on one Azurite: the session's Azurite and webhook receiver, and a fleet of
CentralService instances built from the same settings (as Function instances are)."""

from __future__ import annotations

from typing import List

import pytest

from central.runtime.service import CentralService
from tests.central.conftest import Env, Hook, env, hook, webhook  # noqa: F401 - fixtures reused


class Instances:
    """N instances sharing one store; each VM's envelopes go to one (its Event Hubs partition's owner)."""

    def __init__(self, env: Env, count: int, **settings: str) -> None:  # noqa: F811
        self.env = env
        self.all: List[CentralService] = [env.service(**settings) for _ in range(count)]

    def __getitem__(self, i: int) -> CentralService:
        return self.all[i]


@pytest.fixture
def fleet_of(env: Env):  # noqa: F811
    def make(count: int = 3, **settings: str) -> Instances:
        return Instances(env, count, **settings)

    return make
