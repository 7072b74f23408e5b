"""infra/app/workbook.json (deployed by infra/app/workbook.bicep): valid workbook JSON whose queries read
what central really logs and emits.

- every `extract(@'key=(...)', 1, Message)` of a query over an `se.*` marker matches a line rendered from
  that marker's format string as it stands in central/ (found in the source, so the check survives a
  reshuffle of central's modules), and the marker lines central/telemetry/metrics.py really writes;
- the heartbeat / outbox-drop patterns equal those of the alert rules (tests/central holds those to the
  lines central writes);
- every AppMetrics name is one of central/telemetry/metrics.py's instruments, and every `Properties.<key>` one
  of the attributes that instrument really records (an InMemoryMetricReader says which).
"""

from __future__ import annotations

import ast
import json
import logging
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, Iterator, List, Set

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from central.telemetry import metrics

REPO = Path(__file__).resolve().parents[2]
WORKBOOK = REPO / "infra" / "app" / "workbook.json"
BICEP = REPO / "infra" / "app" / "workbook.bicep"
EXTRACT = re.compile(r"extract\(@'([A-Za-z]+)=(\([^']*\))', 1, Message\)")
MARKER = re.compile(r"Message (?:startswith|has) '(se\.[a-z_]+)")


def workbook() -> Dict:
    return json.loads(WORKBOOK.read_text())


def queries() -> List[Dict]:
    """The Log Analytics queries (queryType 0); the Resource Graph tile: test_workbook_coverage.py."""
    return [item["content"] for item in workbook()["items"]
            if item["type"] == 3 and item["content"].get("queryType", 0) == 0]


def marker_formats() -> Dict[str, str]:
    """{"se.heartbeat": "se.heartbeat vmId=%s name=%s backlog=%d", ...}: every string literal in central/
    that starts with a marker word and has key=%x fields."""
    found: Dict[str, str] = {}
    for path in sorted((REPO / "central").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                match = re.match(r"^(se\.[a-z_]+) [A-Za-z]+=%", node.value)
                if match:
                    found[match.group(1)] = node.value
    return found


def render(fmt: str) -> str:
    """A marker format filled with typical values: ids with dashes and colons, numbers, seconds."""
    def value(match: re.Match) -> str:
        key, conversion = match.groups()
        if key.endswith("Seconds") or conversion.endswith("f"):
            return f"{key}=3.250"
        return f"{key}=7" if conversion == "d" else f"{key}=ab12-cd34:x"

    return re.sub(r"([A-Za-z]+)=%(\.\d+f|[sd])", value, fmt)


def test_workbook_json_is_a_notebook_with_queries_over_the_time_range() -> None:
    book = workbook()
    assert book["version"] == "Notebook/1.0"
    assert book["fallbackResourceIds"] == ["__WORKSPACE_ID__"]
    (params,) = [item for item in book["items"] if item["type"] == 9]
    names = {p["name"] for p in params["content"]["parameters"]}
    assert {"TimeRange", "SilentMinutes"} <= names
    assert len(queries()) >= 8
    for query in queries():
        assert query["version"] == "KqlItem/1.0"
        assert query["timeContextFromParameter"] == "TimeRange"
        for used in re.findall(r"\{([A-Za-z]+)(?::[a-z]+)?\}", query["query"]):
            assert used in names, f"{query['title']}: parameter {used} is not defined"
    titles = " ".join(q["title"].lower() for q in queries())
    for topic in ("open events", "decision", "approvals", "latency", "silent", "quarantine",
                  "alert failures"):
        assert topic in titles


def test_bicep_fills_the_placeholders_and_is_a_shared_workbook() -> None:
    text = BICEP.read_text()
    assert "Microsoft.Insights/workbooks@2023-06-01" in text
    assert "loadTextContent('workbook.json')" in text
    raw = WORKBOOK.read_text()
    for placeholder in re.findall(r"__[A-Z_]+__", raw):
        assert f"'{placeholder}'" in text, f"{placeholder} is never replaced"
    assert "kind: 'shared'" in text and "guid(" in text
    main = (REPO / "infra" / "main.bicep").read_text()
    assert "module workbook 'app/workbook.bicep'" in main


def _extracts_by_marker() -> Dict[str, List[re.Match]]:
    out: Dict[str, List[re.Match]] = {}
    for query in queries():
        text = query["query"]
        # a query may read two markers (a join): split it where each `Message ... 'se.x'` filter starts
        spans = [(m.start(), m.group(1)) for m in MARKER.finditer(text)]
        for i, (start, marker) in enumerate(spans):
            end = spans[i + 1][0] if i + 1 < len(spans) else len(text)
            out.setdefault(marker, []).extend(EXTRACT.finditer(text[start:end]))
    return out


def test_every_extracted_field_is_in_the_marker_central_writes() -> None:
    formats = marker_formats()
    extracts = _extracts_by_marker()
    assert {"se.decision", "se.approval", "se.heartbeat", "se.quarantined", "se.alert"} <= set(extracts)
    for marker, found in extracts.items():
        assert marker in formats, f"the workbook reads {marker} lines, but central/ writes none"
        line = render(formats[marker])
        for match in found:
            key, pattern = match.groups()
            value = re.search(f"{key}={pattern}", line)
            assert value and value.group(1), f"{marker}: {key}={pattern} does not match {line!r}"
            assert f" {key}=" in formats[marker]


def test_heartbeat_patterns_are_the_alert_rules_patterns() -> None:
    alerts = (REPO / "infra" / "app" / "alerts.bicep").read_text()
    alert_patterns = set(re.findall(r"extract(?:_all)?\(@'((?:vmId|dropped)=[^']+)'", alerts))
    ours = {f"{m.group(1)}={m.group(2)}" for marker in ("se.heartbeat", "se.outbox_dropped")
            for m in _extracts_by_marker()[marker] if m.group(1) in ("vmId", "dropped")}
    assert ours and ours <= alert_patterns


def test_the_heartbeats_missing_alert_is_one_alert_for_the_fleet_not_one_per_vm() -> None:
    """A per-vmId dimension made every VM its own alert (an outage of central pages once per VM, each
    scale-in mails twice), and a VM gone for good kept it fired for a day."""
    alerts = (REPO / "infra" / "app" / "alerts.bicep").read_text()
    rule = alerts.split("resource heartbeatsMissing", 1)[1].split("\nresource ", 1)[0]
    assert "dimensions" not in rule and "autoMitigate: true" in rule
    query = alerts.split("var heartbeatsMissingQuery", 1)[1].split("\'\'\'", 2)[1]
    assert "lastSeen < ago({minutes}m) and lastSeen > ago({minutes}m + 1h)" in query


@pytest.fixture
def recorded() -> Iterator[Dict[str, Set[str]]]:
    """{metric name: attribute keys} after one call of each central/telemetry/metrics.py function."""
    reader = InMemoryMetricReader()
    previous = metrics.use(MeterProvider(metric_readers=[reader]))
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    try:
        logging.getLogger("central.metrics").disabled = True
        metrics.envelope("scheduledevents.heartbeat.v1")
        metrics.quarantine("forwarder")
        metrics.decision("approve", "r", event_id="E", event_type="Freeze", state="approving")
        metrics.approval_sent(event_id="E", event_type="Freeze", vm_id="v", first_seen=t0, sent_at=t0)
        metrics.approval_result(True, event_id="E", event_type="Freeze", vm_id="v", sent_at=t0,
                                result_at=t0 + timedelta(seconds=1))
        metrics.alert("event-status", "sent")
        metrics.store_error("commit")
        keys: Dict[str, Set[str]] = {}
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        keys.setdefault(metric.name, set()).update(point.attributes)
        yield keys
    finally:
        logging.getLogger("central.metrics").disabled = False
        metrics.restore(previous)


def test_metric_names_and_dimensions_are_those_central_emits(recorded: Dict[str, Set[str]]) -> None:
    assert set(recorded) == set(metrics.METRIC_NAMES)
    used_names: Set[str] = set()
    for query in queries():
        text = query["query"]
        if not text.startswith("AppMetrics"):
            continue
        names = set(re.findall(r"Name == '([^']+)'", text))
        for listed in re.findall(r"Name in \(([^)]*)\)", text):
            names |= set(re.findall(r"'([^']+)'", listed))
        assert names, f"{query['title']}: reads AppMetrics without naming a metric"
        used_names |= names
        dimensions = set(re.findall(r"Properties\.([A-Za-z_]+)", text))
        for name in names:
            assert name in metrics.METRIC_NAMES, f"{query['title']}: no metric {name}"
        emitted = set().union(*(recorded[n] for n in names))
        assert dimensions <= emitted, f"{query['title']}: {dimensions - emitted} not recorded on {names}"
    assert used_names == set(metrics.METRIC_NAMES)


def test_the_real_marker_lines_match_the_queries(caplog: pytest.LogCaptureFixture) -> None:
    """Beyond the format strings: the lines central/telemetry/metrics.py actually writes."""
    reader = InMemoryMetricReader()
    previous = metrics.use(MeterProvider(metric_readers=[reader]))
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    try:
        with caplog.at_level(logging.INFO, logger="central.metrics"):
            metrics.decision("approve-in-window", "team:web-nights", event_id="C7061BAC-AFDC",
                             event_type="Reboot", state="waiting-window")
            metrics.approval_sent(event_id="C7061BAC-AFDC", event_type="Reboot", vm_id="02aab8a4-74ef",
                                  first_seen=t0, sent_at=t0 + timedelta(seconds=2.5))
            metrics.quarantine("forwarder")
            metrics.log_quarantines([("forwarder", "02aab8a4-74ef"), ("forwarder", "02aab8a4-74ef")])
            metrics.alert("outbox-dropped", "failed")
    finally:
        metrics.restore(previous)
    lines = {r.getMessage().split(" ", 1)[0]: r.getMessage() for r in caplog.records}
    for marker, found in _extracts_by_marker().items():
        if marker not in lines:
            continue
        for match in found:
            key, pattern = match.groups()
            value = re.search(f"{key}={pattern}", lines[marker])
            assert value and value.group(1), f"{key}={pattern} does not match {lines[marker]!r}"
    assert re.search(r"latencySeconds=([0-9.]+)", lines["se.approval"]).group(1) == "2.500"
