"""central/telemetry/metrics.py with OpenTelemetry's InMemoryMetricReader, and the real Azure Monitor exporter
against a local ingestion endpoint (a subprocess, so the global meter provider stays untouched here)."""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Tuple

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from central.telemetry import metrics
from sandbox import processes

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
ID_KEYS = {"vmId", "vm_id", "eventId", "event_id", "messageId", "vm", "name"}


def points(reader: InMemoryMetricReader) -> Dict[str, List[Tuple[Dict[str, Any], Any]]]:
    """{metric name: [(attributes, value or histogram point)]}"""
    out: Dict[str, List[Tuple[Dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            assert scope.scope.name == metrics.METER_NAME
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = point.value if hasattr(point, "value") else point
                    out.setdefault(metric.name, []).append((dict(point.attributes), value))
    return out


def test_a_demo_like_run_emits_the_documented_names_and_attributes(
        reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="central.metrics"):
        for kind in ["scheduledevents.heartbeat.v1"] * 3 + ["scheduledevents.incarnation.v1",
                                                           "scheduledevents.approvalresult.v1", "invalid"]:
            metrics.envelope(kind)
        metrics.quarantine("central")
        metrics.log_quarantines([("central", "vm-1")])
        metrics.decision("approve", "default:short-freeze", event_id="E1", event_type="Freeze",
                         state="approving")
        metrics.decision("hold", "short-notice-on-vm", event_id="E2", event_type="Preempt", state="held")
        metrics.approval_sent(event_id="E1", event_type="Freeze", vm_id="vm-1", first_seen=T0,
                              sent_at=T0 + timedelta(seconds=2))
        metrics.approval_result(True, event_id="E1", event_type="Freeze", vm_id="vm-1",
                                sent_at=T0 + timedelta(seconds=2), result_at=T0 + timedelta(seconds=5))
        metrics.approval_failed_over(event_id="E3", event_type="Reboot", from_vm_id="vm-2")
        metrics.approval_result(False, event_id="E3", event_type="Reboot", vm_id="vm-3", sent_at=None,
                                result_at=T0)
        metrics.alert("event-status", "sent")
        metrics.alert("outbox-dropped", "failed")
        metrics.alert("event-status", "logged")
        metrics.store_error("commit")
    got = points(reader)
    assert set(got) == set(metrics.METRIC_NAMES)
    assert sorted((a["type"], v) for a, v in got[metrics.ENVELOPES]) == \
        [("approvalresult", 1), ("heartbeat", 3), ("incarnation", 1), ("invalid", 1)]
    assert got[metrics.QUARANTINES] == [({"origin": "central"}, 1)]
    assert sorted((a["action"], a["rule"], v) for a, v in got[metrics.DECISIONS]) == \
        [("approve", "default:short-freeze", 1), ("hold", "short-notice-on-vm", 1)]
    assert sorted((a["outcome"], v) for a, v in got[metrics.APPROVALS]) == \
        [("confirmed", 1), ("failed", 1), ("failed_over", 1), ("sent", 1)]
    assert sorted((a["kind"], a["outcome"], v) for a, v in got[metrics.ALERTS]) == \
        [("event-status", "logged", 1), ("event-status", "sent", 1), ("outbox-dropped", "failed", 1)]
    assert got[metrics.STORE_ERRORS] == [({"operation": "commit"}, 1)]
    ((attrs, decision_latency),) = got[metrics.DECISION_LATENCY]
    assert attrs == {"event_type": "Freeze"} and decision_latency.count == 1 and decision_latency.sum == 2.0
    ((attrs, approval_latency),) = got[metrics.APPROVAL_LATENCY]  # the failed result had no send time
    assert attrs == {"event_type": "Freeze", "outcome": "confirmed"} and approval_latency.sum == 3.0
    for name, series in got.items():
        for attrs, _ in series:
            assert not ID_KEYS & set(attrs), f"{name} carries an id attribute: {attrs}"
    lines = [r.getMessage() for r in caplog.records]
    assert ("se.decision eventId=E1 eventType=Freeze action=approve rule=default:short-freeze "
            "state=approving") in lines
    assert "se.approval eventId=E1 eventType=Freeze outcome=confirmed vmId=vm-1 latencySeconds=3.000" in lines
    assert "se.approval eventId=E3 eventType=Reboot outcome=failed vmId=vm-3 latencySeconds=-" in lines
    assert "se.quarantined origin=central vmId=vm-1 count=1" in lines
    assert "se.alert kind=outbox-dropped outcome=failed" in lines


def test_cardinality_is_bounded(reader: InMemoryMetricReader) -> None:
    for i in range(500):
        metrics.decision("approve", f"rule-{i}", event_id=f"E{i}", event_type="Reboot", state="approving")
        metrics.envelope(f"scheduledevents.bogus{i}.v1")
        metrics.approval_sent(event_id=f"E{i}", event_type=f"Weird{i}", vm_id=f"vm-{i}", first_seen=T0,
                              sent_at=T0)
    got = points(reader)
    rules = {a["rule"] for a, _ in got[metrics.DECISIONS]}
    assert len(rules) == 65 and "other" in rules  # 64 kept, the rest counted together
    assert sum(v for _, v in got[metrics.DECISIONS]) == 500  # nothing lost, only folded
    assert got[metrics.ENVELOPES] == [({"type": "other"}, 500)]
    assert [a for a, _ in got[metrics.DECISION_LATENCY]] == [{"event_type": "other"}]


def test_marker_values_never_contain_spaces(reader: InMemoryMetricReader,
                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="central.metrics"):
        metrics.decision("approve in window", "", event_id="E 1", event_type="Freeze", state="held")
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == "se.decision eventId=E_1 eventType=Freeze action=approve_in_window rule=- state=held"


def test_negative_latency_from_clock_skew_is_zero(reader: InMemoryMetricReader) -> None:
    metrics.approval_sent(event_id="E", event_type="Freeze", vm_id="v", first_seen=T0 + timedelta(seconds=5),
                          sent_at=T0)
    ((_, point),) = points(reader)[metrics.DECISION_LATENCY]
    assert point.sum == 0.0


@pytest.mark.parametrize("text, expected", [
    ("ClientId=1234;Authorization=AAD", "1234"),
    ("Authorization=AAD", ""),  # system-assigned identity
    ("", None),
    ("ClientId=1234", None),
])
def test_authentication_string(text: str, expected: Any) -> None:
    assert metrics.client_id_of(text) == expected


def test_without_a_connection_string_nothing_is_configured() -> None:
    assert metrics.configure("") is False


class _Ingestion(BaseHTTPRequestHandler):
    """Application Insights' track endpoint, locally: keeps every telemetry item posted."""

    items: List[Dict[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        text = body.decode()
        for line in text.splitlines() if not text.lstrip().startswith("[") else [text]:
            parsed = json.loads(line)
            _Ingestion.items.extend(parsed if isinstance(parsed, list) else [parsed])
        reply = json.dumps({"itemsReceived": 1, "itemsAccepted": 1, "errors": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


CHILD = """
import sys
from opentelemetry import metrics as otel
from central.telemetry import metrics
assert metrics.configure(sys.argv[1]) is True
metrics.envelope("scheduledevents.heartbeat.v1")
metrics.decision("approve", "default:short-freeze", event_id="E1", event_type="Freeze", state="approving")
otel.get_meter_provider().shutdown()  # flushes the periodic reader through the Azure Monitor exporter
"""


def test_configure_exports_through_the_azure_monitor_distro(tmp_path: Any) -> None:
    _Ingestion.items = []
    server = ThreadingHTTPServer((processes.LOOPBACK, 0), _Ingestion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://{processes.LOOPBACK}:{server.server_address[1]}/"
    connection_string = ("InstrumentationKey=00000000-0000-0000-0000-000000000000;"
                         f"IngestionEndpoint={endpoint}")
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, connection_string], cwd=processes.REPO,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "APPLICATIONINSIGHTS_STATSBEAT_DISABLED_ALL": "true"})
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    metric_points = [m for item in _Ingestion.items if item.get("data", {}).get("baseType") == "MetricData"
                     for m in item["data"]["baseData"]["metrics"]]
    names = {m["name"]: m for m in metric_points}
    assert names[metrics.ENVELOPES]["value"] == 1
    assert names[metrics.DECISIONS]["value"] == 1
    props = [item["data"]["baseData"].get("properties", {}) for item in _Ingestion.items
             if item.get("data", {}).get("baseType") == "MetricData"
             and item["data"]["baseData"]["metrics"][0]["name"] == metrics.DECISIONS]
    assert props == [{"action": "approve", "rule": "default:short-freeze"}]
    assert not [i for i in _Ingestion.items if i.get("data", {}).get("baseType") == "MessageData"]
