"""One valid example per envelope type; typical mistakes in an envelope are rejected with their path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict

import pytest

import schemas

SCHEMA = "envelope.schema.json"
EXAMPLES = Path(schemas.__file__).resolve().parent / "examples" / "envelope"
FILES = sorted(EXAMPLES.glob("*.json"))


def _load(name: str) -> Dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text(encoding="utf-8"))


def test_every_envelope_type_has_an_example() -> None:
    types = set(schemas.load(SCHEMA)["properties"]["type"]["enum"])
    assert {json.loads(p.read_text())["type"] for p in FILES} == types


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_envelope_example_validates(path: Path) -> None:
    envelope = json.loads(path.read_text(encoding="utf-8"))
    assert schemas.errors(SCHEMA, envelope) == []
    assert envelope["partitionkey"] == envelope["data"]["vm"]["vmId"]  # one VM stays in order
    assert envelope["subject"] == envelope["data"]["vm"]["name"]


def test_incarnation_example_carries_a_valid_imds_document() -> None:
    data = _load("incarnation.json")["data"]
    assert schemas.errors("imds-scheduled-events.schema.json", data["document"]) == []
    assert data["incarnation"] == data["document"]["DocumentIncarnation"]


def _drop(*keys: str):
    def apply(env: Dict[str, Any]) -> None:
        target = env
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
    return apply


WRONG = {
    # name: (example, mutation, expected path, a word of the message)
    "no-id": ("heartbeat.json", _drop("id"), "/", "id"),
    "wrong-specversion": ("heartbeat.json", lambda e: e.update(specversion="0.3"), "/specversion", "1.0"),
    "unknown-type": ("heartbeat.json", lambda e: e.update(type="scheduledevents.other.v1"), "/type", "other"),
    "no-partitionkey": ("incarnation.json", _drop("partitionkey"), "/", "partitionkey"),
    "time-not-a-date": ("incarnation.json", lambda e: e.update(time="yesterday"), "/time", "date-time"),
    "incarnation-without-diff": ("incarnation.json", _drop("data", "diff"), "/data", "diff"),
    "incarnation-document-invalid": ("incarnation.json",
                                     lambda e: e["data"]["document"].update(Events="none"),
                                     "/data/document/Events", "array"),
    "vm-without-vmid": ("incarnation.json", _drop("data", "vm", "vmId"), "/data/vm", "vmId"),
    "heartbeat-negative-backlog": ("heartbeat.json", lambda e: e["data"]["outbox"].update(backlog=-1),
                                   "/data/outbox/backlog", "-1"),
    "quarantined-without-errors": ("quarantined.json", lambda e: e["data"].update(errors=[]),
                                   "/data/errors", "non-empty"),
    "approval-unknown-outcome": ("approvalresult.json", lambda e: e["data"].update(outcome="maybe"),
                                 "/data/outcome", "maybe"),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_envelope_is_rejected(name: str) -> None:
    example, mutate, path, word = WRONG[name]
    envelope = copy.deepcopy(_load(example))
    mutate(envelope)
    found = schemas.errors(SCHEMA, envelope)
    assert found, f"{name} should be rejected"
    assert found[0]["path"] == path, found
    assert word in found[0]["message"], found
