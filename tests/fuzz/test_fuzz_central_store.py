"""Issue 14, property 0, as a fuzz property against the real store: whatever schema-valid envelope comes
in (built by the forwarder, then stretched to the edges of what the schema allows: dates at the ends of
RFC 3339, integers past Int32 and Int64, key characters Azure Tables forbids, lone surrogates), the call
never raises and the next innocent batch is applied."""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict

from hypothesis import assume, given
from hypothesis import strategies as st

import schemas
from central.runtime.service import CentralService
from sandbox import processes
from tests import signing
from tests.central.factory import T0, Vm, body, event

from . import strategies as S
from .counting import count, fuzz

EDGE_TIMES = [
    "0001-01-01T00:00:00+01:00",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59-01:00",
    "9999-12-31T23:59:59Z",
    "1600-12-31T23:59:59Z",
    "2026-11-21T12:00:00+14:00",
]
EDGE_INTS = [2**31 - 1, 2**31, 2**32 + 1, 2**53, 2**63 - 1, 2**63, 2**70]
EDGE_TEXT = ["E\x00", "E\x1f", "E\x7f", "E/x", "E#x", "E?x", "E\\x", "E\ud800", "\udfff", "", " ", "é" * 128]


@st.composite
def stretched(draw: Any) -> Dict[str, Any]:
    env = draw(S.valid_envelope())
    data = env["data"]
    what = draw(
        st.sampled_from(
            (
                "time",
                "observed",
                "incarnation",
                "dropped",
                "eventid",
                "notbefore",
                "duration",
                "resultid",
                "name",
                "none",
            )
        )
    )
    events = (data.get("document") or {}).get("Events") or []
    if what == "time":
        env["time"] = draw(st.sampled_from(EDGE_TIMES))
    elif what == "observed" and "observedAt" in data:
        data["observedAt"] = draw(st.sampled_from(EDGE_TIMES))
    elif what == "incarnation" and "incarnation" in data and isinstance(data["incarnation"], int):
        data["incarnation"] = draw(st.sampled_from(EDGE_INTS))
    elif what == "dropped" and "outbox" in data:
        data["outbox"]["dropped"] = draw(st.sampled_from(EDGE_INTS))
    elif what == "eventid" and events:
        events[0]["EventId"] = draw(st.sampled_from(EDGE_TEXT))
    elif what == "notbefore" and events:
        events[0]["NotBefore"] = draw(st.sampled_from(EDGE_TIMES))
    elif what == "duration" and events:
        events[0]["DurationInSeconds"] = draw(st.sampled_from(EDGE_INTS))
    elif what == "resultid" and "eventId" in data:
        data["eventId"] = draw(st.sampled_from(EDGE_TEXT))
    elif what == "name":
        data["vm"]["name"] = draw(st.sampled_from([*EDGE_TEXT[:-3], "n" * 256]))
    return env


class World:
    svc: CentralService
    n = 0


WORLD = World()


def service(azurite: processes.Server) -> CentralService:
    if not hasattr(WORLD, "svc"):
        WORLD.svc = signing.central(
            {
                "ApprovalStorage": azurite.extra["connection_string"],
                "TABLE_PREFIX": "fz" + uuid.uuid4().hex[:10],
                "ALERT_WEBHOOK_URL": "",
            }
        )
    return WORLD.svc


@fuzz(60)
@given(stretched())
def test_after_any_schema_valid_envelope_the_next_innocent_batch_is_applied(
    azurite: processes.Server, env: Dict[str, Any]
) -> None:
    try:
        text = json.dumps(env)
    except (ValueError, UnicodeEncodeError):  # pragma: no cover - json.dumps escapes surrogates
        assume(False)
    assume(schemas.validator("envelope.schema.json").is_valid(json.loads(text)))
    svc = service(azurite)
    result = svc.handle_batch([text.encode("utf-8")], now=T0)  # never raises: that is the property
    count("central.stretched", "quarantined" if result.quarantined else "applied")
    WORLD.n += 1
    vm = Vm(f"innocent-{WORLD.n}")
    ok = svc.handle_batch(
        [
            body(vm.heartbeat()),
            body(vm.incarnation_env([event(f"E-inn-{WORLD.n}", [vm.name], source="User")])),
        ],
        now=T0,
    )
    assert ok.processed == 2 and ok.quarantined == 0 and not ok.errors, ok
    assert svc.event(f"E-inn-{WORLD.n}")["state"] == "approving"
