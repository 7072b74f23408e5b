"""The IMDS example documents (one set per api-version, from the reference pages) are valid and show
only the fields their api-version has."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

import schemas

EXAMPLES = Path(schemas.__file__).resolve().parent / "examples" / "imds"
SCHEMA = "imds-scheduled-events.schema.json"
VERSIONS = ["2017-03-01", "2017-08-01", "2017-11-01", "2019-01-01", "2019-04-01", "2019-08-01", "2020-07-01"]
# From the reference: when each event type and optional field appeared.
TYPE_SINCE = {"Freeze": "2017-03-01", "Reboot": "2017-03-01", "Redeploy": "2017-03-01",
              "Preempt": "2017-11-01", "Terminate": "2019-01-01"}
FIELD_SINCE = {"Description": "2019-04-01", "EventSource": "2019-08-01", "DurationInSeconds": "2020-07-01"}
BASE = {"EventId", "EventStatus", "EventType", "ResourceType", "Resources", "NotBefore"}

FILES = sorted(EXAMPLES.glob("*.json"))


def _load(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def test_there_is_an_example_for_every_api_version() -> None:
    versions = {p.name[:10] for p in FILES}
    assert versions == set(VERSIONS)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_example_validates(path: Path) -> None:
    assert schemas.errors(SCHEMA, _load(path)) == []


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_example_shows_only_what_its_api_version_has(path: Path) -> None:
    version = path.name[:10]
    allowed = BASE | {f for f, since in FIELD_SINCE.items() if version >= since}
    for event in _load(path)["Events"]:
        assert set(event) <= allowed, f"{path.name}: {sorted(set(event) - allowed)} not in {version}"
        kind = event["EventType"]
        assert version >= TYPE_SINCE[kind], f"{path.name}: {kind} not in {version}"
        if version >= "2020-07-01":  # the newest version shows every field
            assert set(event) == BASE | set(FIELD_SINCE)


def test_westno_live_migration_sequence() -> None:
    """The docs' sequence: [] -> Freeze Scheduled -> the same event Started (NotBefore "") -> []."""
    docs: List[Dict[str, Any]] = [_load(p) for p in sorted(EXAMPLES.glob("2020-07-01_westno-*.json"))]
    assert [d["DocumentIncarnation"] for d in docs] == [1, 2, 3, 4]
    assert docs[0]["Events"] == [] and docs[3]["Events"] == []
    scheduled, started = docs[1]["Events"][0], docs[2]["Events"][0]
    assert scheduled["EventId"] == started["EventId"]
    assert (scheduled["EventStatus"], started["EventStatus"]) == ("Scheduled", "Started")
    assert scheduled["NotBefore"] and started["NotBefore"] == ""
    assert scheduled["Resources"] == started["Resources"] == ["WestNO_0", "WestNO_1"]
    assert scheduled["DurationInSeconds"] == 5


def test_schema_tolerates_what_the_reference_says_it_must() -> None:
    """Unknown properties, a digit-string incarnation (a C# sample), ISO NotBefore (a preview page)."""
    doc = _load(EXAMPLES / "2020-07-01_westno-2-freeze-scheduled.json")
    doc["DocumentIncarnation"] = "2"
    doc["SomethingNew"] = {"x": 1}
    doc["Events"][0]["FutureField"] = True
    doc["Events"][0]["NotBefore"] = "2016-09-19T18:29:47Z"
    assert schemas.errors(SCHEMA, doc) == []
