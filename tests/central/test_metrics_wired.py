"""Central's metrics as a real CentralService on Azurite records them (issue 15, item 1): a small scenario
(an approval confirmed, one failed over, a quarantine, alerts, a store failure) through an
InMemoryMetricReader: every documented name with its attributes, bounded values, never an id, and the
se.* log markers the workbook reads."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from central.store.tables import StoreError
from central.telemetry import metrics

from .conftest import Env, Hook
from .factory import T0, Vm, body, event
from .test_metrics import ID_KEYS, points

TWO_VMS = {"version": 1,
           "rules": [{"name": "reboots", "match": {"eventTypes": ["Reboot"]}, "action": "approve"}]}


def test_a_scenario_through_central_records_every_metric(
    env: Env, hook: Hook, reader: InMemoryMetricReader, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc = env.service(POLICY_JSON=json.dumps(TWO_VMS), APPROVAL_RESULT_TIMEOUT_SECONDS="60",
                      APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS="60")
    a, b = Vm("vm-a"), Vm("vm-b")
    with caplog.at_level(logging.INFO):
        svc.handle_batch([body(a.heartbeat()), body(b.heartbeat()),
                          body(a.incarnation_env([event("E-1", ["vm-a"])])),
                          body(b.incarnation_env([event("E-2", ["vm-a", "vm-b"])])), b"{not json"], now=T0)
        (m1, _) = sorted(env.messages(a.vm_id), key=lambda m: m["eventId"])
        svc.handle_batch([body(a.result("E-1", "approved", m1["messageId"], at=T0 + timedelta(seconds=4)))],
                         now=T0 + timedelta(seconds=4))
        later = T0 + timedelta(seconds=70)  # vm-a never answers for E-2: failover to vm-b
        svc.handle_batch([body(a.heartbeat(at=later)), body(b.heartbeat(at=later))], now=later)
        svc.reevaluate(now=later)
        monkeypatch.setattr(svc.state.store, "transact", _fail)
        with pytest.raises(StoreError):
            svc.handle_batch([body(b.incarnation_env([], at=later))], now=later)
    found = points(reader)
    assert set(found) == set(metrics.METRIC_NAMES)
    for name, series in found.items():
        for attributes, _ in series:
            assert not set(attributes) & ID_KEYS, f"{name} carries an id: {attributes}"
    envelopes = {p[0]["type"]: p[1] for p in found[metrics.ENVELOPES]}
    assert envelopes == {"heartbeat": 4, "incarnation": 2, "approvalresult": 1}
    assert {p[0]["origin"] for p in found[metrics.QUARANTINES]} == {"central"}
    approvals = {p[0]["outcome"]: p[1] for p in found[metrics.APPROVALS]}
    assert approvals == {"sent": 3, "confirmed": 1, "failed_over": 1}
    decisions = {(p[0]["action"], p[0]["rule"]) for p in found[metrics.DECISIONS]}
    assert {("approve", "reboots"), ("failover", "reboots")} <= decisions
    (latency,) = [p[1] for p in found[metrics.APPROVAL_LATENCY]]
    assert latency.count == 1 and latency.sum == pytest.approx(4.0)
    assert {p[0]["operation"] for p in found[metrics.STORE_ERRORS]} == {"commit"}
    assert {p[0]["outcome"] for p in found[metrics.ALERTS]} == {"sent"}
    lines = [r.getMessage() for r in caplog.records]
    for marker in ("se.decision ", "se.approval ", "se.quarantined ", "se.alert ", "se.store_error "):
        assert any(line.startswith(marker) for line in lines), marker


def _fail(table, ops):
    raise StoreError("Tables unreachable")
