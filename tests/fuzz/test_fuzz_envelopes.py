"""Envelope bodies (built by the forwarder, mutated, hostile) through central's parse_body, the
function every Event Hubs message goes through: never an exception; a body is accepted only when
it is strict enough for central (schema-valid, readable time, partitionkey = data.vm.vmId) and
otherwise quarantined with at least one explained error and a hash of the whole body.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import schemas
from central.intake import parse as envelopes

from . import strategies as S
from .counting import SLOW_FACTOR, count, fuzz

SCHEMA = "envelope.schema.json"


def text_of(body: Any) -> str:
    return bytes(body).decode("utf-8", errors="replace") if isinstance(body, bytes) else body


def oracle_accepts(body: Any) -> bool:
    """Independent of central's code: JSON, the schema, and the partition key rule."""
    try:
        obj = json.loads(text_of(body))
        if schemas.errors(SCHEMA, obj):
            return False
    except (ValueError, RecursionError):
        return False
    vm = obj["data"].get("vm") or {}
    return obj["partitionkey"] == (vm.get("vmId") or obj["partitionkey"])


def check(name: str, body: Any) -> None:
    item = envelopes.parse_body(body)  # never raises: an exception fails the test with the example
    if isinstance(item, envelopes.Envelope):
        assert oracle_accepts(body), f"accepted a body the oracle refuses: {text_of(body):.300}"
        assert item.vm_id and item.id and item.type in (envelopes.INCARNATION, envelopes.HEARTBEAT,
                                                        envelopes.QUARANTINED, envelopes.APPROVAL_RESULT)
        count(name, "accepted")
        return
    assert isinstance(item, envelopes.BadEnvelope)
    assert item.errors, "quarantined without a reason"
    for err in item.errors:
        assert isinstance(err["path"], str) and isinstance(err["message"], str) and err["message"].strip()
    text = text_of(body)
    assert item.sha256 == hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    count(name, "quarantined")


@fuzz(1100)
@given(S.valid_envelope(), st.randoms(use_true_random=False))
def test_forwarder_envelopes_are_accepted_and_mutants_explained(env: Any, rnd: Any) -> None:
    body = json.dumps(env)
    assert isinstance(envelopes.parse_body(body), envelopes.Envelope)  # what VMs send is accepted
    check("envelope.valid", body)
    check("envelope.valid-bytes", body.encode("utf-8"))
    for _ in range(6):
        mutant = json.loads(body)
        path = rnd.choice(S._paths(mutant)[1:])
        parent = mutant
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and rnd.random() < 0.4:
            del parent[path[-1]]
        else:
            parent[path[-1]] = rnd.choice([None, True, -1, 1.5, "", "x" * 3000, [], {},
                                           "2026-99-99T00:00:00Z", "scheduledevents.other.v1", "0.9"])
        check("envelope.mutated", json.dumps(mutant))


@fuzz(1000)
@given(S.hostile_envelope_body())
def test_hostile_bodies_are_quarantined_with_reasons(body: Any) -> None:
    check("envelope.hostile", body)


@pytest.mark.slow
@fuzz(1000 * SLOW_FACTOR)
@given(S.envelope_bodies)
def test_slow_many_more_envelopes(body: Any) -> None:
    check("envelope.slow", body)
