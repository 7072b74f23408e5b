"""Malformed IMDS documents are rejected, each with a message naming where the problem is."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

import schemas

SCHEMA = "imds-scheduled-events.schema.json"
EXAMPLES = Path(schemas.__file__).resolve().parent / "examples" / "imds"
GOOD: Dict[str, Any] = json.loads((EXAMPLES / "2020-07-01_westno-2-freeze-scheduled.json").read_text("utf-8"))


def _event(**changes: Any) -> Callable[[Dict[str, Any]], None]:
    def apply(doc: Dict[str, Any]) -> None:
        for key, value in changes.items():
            if value is _DROP:
                del doc["Events"][0][key]
            else:
                doc["Events"][0][key] = value
    return apply


_DROP = object()

CASES = {
    # name: (mutation, expected path, a word the message must contain)
    "missing-incarnation": (lambda d: d.pop("DocumentIncarnation"), "/", "DocumentIncarnation"),
    "missing-events": (lambda d: d.pop("Events"), "/", "Events"),
    "events-not-a-list": (lambda d: d.update(Events={"0": {}}), "/Events", "array"),
    "negative-incarnation": (lambda d: d.update(DocumentIncarnation=-1), "/DocumentIncarnation", "-1"),
    "incarnation-not-a-number": (lambda d: d.update(DocumentIncarnation="two"), "/DocumentIncarnation",
                                 "two"),
    "incarnation-float": (lambda d: d.update(DocumentIncarnation=2.5), "/DocumentIncarnation", "2.5"),
    "missing-event-id": (_event(EventId=_DROP), "/Events/0", "EventId"),
    "empty-event-id": (_event(EventId=""), "/Events/0/EventId", "non-empty"),
    "bad-status": (_event(EventStatus="Completed"), "/Events/0/EventStatus", "Completed"),
    "bad-type": (_event(EventType="Explode"), "/Events/0/EventType", "Explode"),
    "bad-resource-type": (_event(ResourceType="Disk"), "/Events/0/ResourceType", "Disk"),
    "resources-not-a-list": (_event(Resources="WestNO_0"), "/Events/0/Resources", "array"),
    "missing-not-before": (_event(NotBefore=_DROP), "/Events/0", "NotBefore"),
    "not-before-free-text": (_event(NotBefore="tomorrow"), "/Events/0/NotBefore", "tomorrow"),
    "not-before-no-zone": (_event(NotBefore="2022-04-11 22:26:58"), "/Events/0/NotBefore", "22:26:58"),
    "not-before-no-day-name": (_event(NotBefore="11 Apr 2022 22:26:58 GMT"), "/Events/0/NotBefore", "Apr"),
    "duration-below-minus-one": (_event(DurationInSeconds=-2), "/Events/0/DurationInSeconds", "-2"),
    "duration-not-integer": (_event(DurationInSeconds=1.5), "/Events/0/DurationInSeconds", "1.5"),
    "duration-string": (_event(DurationInSeconds="5"), "/Events/0/DurationInSeconds", "5"),
    "bad-source": (_event(EventSource="Customer"), "/Events/0/EventSource", "Customer"),
    "description-not-string": (_event(Description=["x"]), "/Events/0/Description", "string"),
    "event-not-object": (lambda d: d.update(Events=["Freeze"]), "/Events/0", "object"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_document_is_rejected_with_its_path(name: str) -> None:
    mutate, path, word = CASES[name]
    doc = copy.deepcopy(GOOD)
    mutate(doc)
    found = schemas.errors(SCHEMA, doc)
    assert found, f"{name} should be rejected"
    assert found[0]["path"] == path, found
    assert word in found[0]["message"], found


@pytest.mark.parametrize("doc", [[], "text", None, 7], ids=["list", "string", "null", "number"])
def test_a_document_that_is_not_an_object_is_rejected(doc: Any) -> None:
    found = schemas.errors(SCHEMA, doc)
    assert found and found[0]["path"] == "/" and "object" in found[0]["message"]


def test_every_error_is_reported_not_only_the_first() -> None:
    doc = copy.deepcopy(GOOD)
    doc["DocumentIncarnation"] = -5
    doc["Events"][0]["EventType"] = "Explode"
    paths = {e["path"] for e in schemas.errors(SCHEMA, doc)}
    assert {"/DocumentIncarnation", "/Events/0/EventType"} <= paths
