"""The demo's second act (sandbox/demo/witness.py, issue 23), end to end on every real process: an agentless
VM approved through ARM before NotBefore, a single-VM event whose forwarder is killed mid-drain approved
through ARM after failover, a platform Canceled ending an event its VM still listed. One run serves every
assertion; the checks are shown to fail on evidence with a second approval."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterator

import pytest

from sandbox.demo import witness


@pytest.fixture(scope="module")
def act(tmp_path_factory: pytest.TempPathFactory) -> Iterator[witness.WitnessOutcome]:
    work: Path = tmp_path_factory.mktemp("witness") / "work"
    yield witness.run(work, say=lambda text: None)


def test_every_check_of_the_second_act_holds(act: witness.WitnessOutcome) -> None:
    assert not act.error, act.error
    failed = [f"{c.scene} {c.what}: {c.detail}" for c in act.checks if not c.ok]
    assert act.checks and not failed, failed


def test_the_checks_catch_a_second_approval_and_an_imds_post(act: witness.WitnessOutcome) -> None:
    assert act.evidence is not None
    ev = copy.deepcopy(act.evidence)
    w1, w2 = act.plan[0].event_id, act.plan[1].event_id
    ev.arm_calls.append(next(c for c in ev.arm_calls if w1 in c["ids"]))  # ARM called twice for w1
    import json

    ev.posts.append({"vm": "vm-d", "status": 200, "path": "/metadata/scheduledevents",
                     "body": json.dumps({"StartRequests": [{"EventId": w2}]})})  # and vm-d POSTed too
    failed = {(c.scene, c.what.split(";")[0]) for c in witness.check(act.plan, ev) if not c.ok}
    assert failed == {("w1", "one ARM acknowledge, at virtualMachines/vm-x"),
                      ("w2", "one ARM acknowledge, at virtualMachines/vm-d")}
