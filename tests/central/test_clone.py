"""central.model.clone: the fast copy of an event record equals copy.deepcopy's and shares nothing mutable
with the original (a plan mutates its copy; the cached record must not change)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

from central.model.clone import clone_event, tree
from central.model.events import Approval, EventRecord

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def rich() -> EventRecord:
    rec = EventRecord(event_id="E-1", first_seen=T0)
    rec.absorb({"EventId": "E-1", "EventType": "Reboot", "Resources": ["b", "a"], "EventStatus": "Scheduled",
                "NotBefore": "Wed, 25 Nov 2026 12:15:00 GMT", "DurationInSeconds": 5}, "id-a", "a", T0)
    rec.move("Started", T0 + timedelta(minutes=1), "a")
    rec.approvals.append(Approval(1, "m-1", "id-a", "a", "q-a", "approve", "policy:r", T0,
                                  T0 + timedelta(minutes=5),
                                  message={"eventId": "E-1", "nested": [1, {"x": 2}]}))
    rec.decision = {"action": "approve", "rule": "r", "at": T0.isoformat()}
    rec.platform = {"status": "Started", "gridIds": ["g1", "g2"], "owner": {"kind": "virtualMachines"},
                    "transitions": [{"said": "Scheduled", "eventTime": None}]}
    rec.pending_alerts = [{"key": "E-1:status", "rounds": 0, "facts": {"resources": ["a", "b"]}}]
    rec.claim = {"by": "a", "rank": 1}
    return rec


def test_the_clone_equals_deepcopy_and_shares_no_mutable_part() -> None:
    rec = rich()
    before = copy.deepcopy(rec)
    mine = clone_event(rec)
    assert mine == before and type(mine) is EventRecord and type(mine.approvals[0]) is Approval
    mine.platform["transitions"][0]["said"] = "changed"
    mine.platform["gridIds"].append("g3")
    mine.history[0]["status"] = "changed"
    mine.approvals[0].result = "approved"
    mine.approvals[0].message["nested"][1]["x"] = 3  # type: ignore[index]
    mine.pending_alerts[0]["facts"]["resources"].append("c")
    mine.resources.append("z")
    mine.reported_by["x"] = "y"
    assert rec == before  # the original is untouched


def test_anything_not_json_like_falls_back_to_deepcopy() -> None:
    odd = {"set": {1, 2}, "nested": [({"a": [1]},)]}
    copied = tree(odd)
    assert copied == odd and copied["set"] is not odd["set"]
    assert copied["nested"][0][0]["a"] is not odd["nested"][0][0]["a"]
