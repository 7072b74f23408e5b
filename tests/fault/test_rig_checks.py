"""The fault rig's own checks can fail: the budget check finds two VMs of one set Started at once, and the
hub-order check finds an envelope drained out of order (run on made-up records, no processes)."""

from __future__ import annotations

from typing import Any, Dict, List

from sandbox.demo.fleet import VmSpec
from tests.forwarder_eventhubs.helpers import Received

from .pipeline_rig import BUDGET_TAG, budget_overlaps
from .test_eventhubs_outage import out_of_order


class Imds:
    def __init__(self, events: Dict[str, Dict[str, Any]]) -> None:
        self.events = events

    def event(self, eid: str) -> Dict[str, Any]:
        return self.events[eid]


def ev(vm: str, started: str, gone: str) -> Dict[str, Any]:
    return {"resources": [vm], "startedAt": f"2026-01-01T00:{started}Z", "goneAt": f"2026-01-01T00:{gone}Z"}


def test_budget_overlap_found_within_a_set_only() -> None:
    specs = [VmSpec(name, {BUDGET_TAG: group}) for name, group in (("a", "s0"), ("b", "s0"), ("c", "s1"))]
    turns = Imds({"1": ev("a", "00:00", "00:10"), "2": ev("b", "00:11", "00:20"),
                  "3": ev("c", "00:05", "00:15")})
    assert budget_overlaps(turns, specs, ["1", "2", "3"]) == []
    both = Imds({"1": ev("a", "00:00", "00:10"), "2": ev("b", "00:09", "00:20")})
    assert budget_overlaps(both, specs, ["1", "2"]) == ["1 and 2"]


def item(seq: int, eid: str, made: str, incarnation: int) -> Received:
    env = {"id": eid, "time": f"2026-01-01T00:00:{made}Z", "type": "scheduledevents.incarnation.v1",
           "partitionkey": "vm", "data": {"incarnation": incarnation}}
    return Received(partition="0", sequence=seq, partition_key="vm", content_type=None, envelope=env)


def test_hub_order_check_finds_a_late_envelope_and_ignores_a_repeat() -> None:
    ordered: List[Received] = [item(1, "x", "01", 1), item(2, "y", "02", 2), item(3, "x", "01", 1)]
    assert out_of_order(ordered) == []
    swapped = [item(1, "y", "02", 2), item(2, "x", "01", 1)]
    assert len(out_of_order(swapped)) == 2  # made earlier, and a lower incarnation
