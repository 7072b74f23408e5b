"""Minimal reproductions of bugs the fault suite found (each fixed in its own commit)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from central.runtime.service import CLAIM_SEND_GRACE
from sandbox import processes
from tests import signing
from tests.central.factory import Vm, body, event
from tests.store_faults import refusing_store

from .central_rig import now


def test_an_event_that_starts_while_its_approval_is_outstanding_does_not_break_the_batch(
        azurite: processes.Server) -> None:
    # Found by test_central_restarts: `rec.outstanding` is a property that turns None once its result is
    # set, so the second `rec.outstanding.result_at` raised AttributeError and the batch was retried forever.
    svc = signing.central({"ApprovalStorage": azurite.extra["connection_string"],
                                        "TABLE_PREFIX": "reg" + uuid.uuid4().hex[:8],
                                        "ALERT_WEBHOOK_URL": ""})
    vm = Vm(name="regvm0")
    eid = str(uuid.uuid4()).upper()
    scheduled = [event(eid, [vm.name], "Reboot", "Scheduled", not_before=now() + timedelta(hours=1))]
    first = svc.handle_batch([body(vm.incarnation_env(scheduled, at=now()))])
    assert len(first.decisions) == 1
    assert next(e for e in svc.pending() if e["eventId"] == eid)["approvals"], "an approval is outstanding"
    now_started = [event(eid, [vm.name], "Reboot", "Started")]
    started = svc.handle_batch([body(vm.incarnation_env(now_started, at=now()))])
    assert started.processed == 1
    view = next(e for e in svc.pending() if e["eventId"] == eid)
    assert view["status"] == "Started"
    assert view["approvals"][-1]["result"] == "event-started"


def test_central_approval_queue_client_does_not_stall_a_minute_when_storage_is_down() -> None:
    # Found by test_storage_webhook_outages: with the SDK's default retry (15 s backoff, 3 retries) one
    # approval send to a dead queue service took ~79 s, holding central's lock and the ingest batch.
    from central.runtime.settings import storage_clients

    _, queues = storage_clients({"ApprovalStorage": processes.azurite_connection_string(9, 9, 9)})
    policy = queues._config.retry_policy  # the policy the client was built with
    assert policy.total_retries <= 1
    assert policy.initial_backoff <= 2


class _Crash(BaseException):
    """Stands in for SIGKILL inside one process: nothing in central catches a BaseException."""


def test_a_crash_between_the_approval_claim_and_the_send_still_delivers_the_approval(
        azurite: processes.Server) -> None:
    settings = {"ApprovalStorage": azurite.extra["connection_string"],
                "TABLE_PREFIX": "gap" + uuid.uuid4().hex[:8], "ALERT_WEBHOOK_URL": "",
                "APPROVAL_RESULT_TIMEOUT_SECONDS": "3600"}
    first = signing.central(settings)
    vm = Vm(name="gapvm0")
    eid = str(uuid.uuid4()).upper()
    envelope = body(vm.incarnation_env([event(eid, [vm.name], "Reboot", "Scheduled",
                                              not_before=now() + timedelta(hours=1))], at=now()))

    class CrashingSender:
        def send(self, *args: object, **kwargs: object) -> str:
            raise _Crash

    first.sender = CrashingSender()
    with pytest.raises(_Crash):
        first.handle_batch([envelope])
    restarted = signing.central(settings)  # the replacement instance, same storage
    restarted.handle_batch([envelope])  # the batch is redelivered
    restarted.reevaluate()  # at once: the claim may still be in flight elsewhere, so nothing is sent yet
    assert approval_messages_for(azurite.extra["connection_string"], vm.vm_id, eid) == 0
    # the timer, once the claim is older than the in-flight grace: the claimed message is sent, once
    later = now() + timedelta(seconds=CLAIM_SEND_GRACE + 1)
    restarted.reevaluate(now=later)
    restarted.reevaluate(now=later + timedelta(seconds=60))
    assert approval_messages_for(azurite.extra["connection_string"], vm.vm_id, eid) == 1


def approval_messages_for(storage: str, vm_id: str, event_id: str) -> int:
    from tests.fault.central_rig import approval_messages

    return sum(m["eventId"] == event_id for m in approval_messages(storage, vm_id))


def test_an_alert_delivered_just_before_a_crash_still_gets_its_row(azurite: processes.Server) -> None:
    # Found by test_central_restarts ("alert rows missing"): a kill after the webhook POST and before the
    # call's table flush left the alert claimed, so the replay never wrote its Alerts row.
    from azure.data.tables import TableServiceClient

    prefix = "alr" + uuid.uuid4().hex[:8]
    settings = {"ApprovalStorage": azurite.extra["connection_string"], "TABLE_PREFIX": prefix,
                "ALERT_WEBHOOK_URL": ""}
    vm = Vm(name="alrvm0")
    eid = str(uuid.uuid4()).upper()
    envelope = body(vm.incarnation_env([event(eid, [vm.name], "Reboot", "Scheduled",
                                              not_before=now() + timedelta(hours=1))], at=now()))
    first = signing.central(settings)

    def crash() -> int:
        raise _Crash

    first.store.flush = crash  # the process dies after the alert went out, before the rows are written
    with pytest.raises(_Crash):
        first.handle_batch([envelope])
    restarted = signing.central(settings)
    restarted.handle_batch([envelope])  # the batch is redelivered: the incarnation is already applied
    # the alert is still owed (its row in the State table): any instance's timer, once the first
    # instance's lease is over, delivers it again (same key) and writes its row
    restarted.reevaluate(now=now() + timedelta(seconds=61))
    tables = TableServiceClient.from_connection_string(azurite.extra["connection_string"])
    rows = list(tables.get_table_client(f"{prefix}Alerts").list_entities())
    mine = [r for r in rows if r.get("EventId") == eid and r.get("Status") == "Scheduled"]
    assert len(mine) == 1, rows


def test_an_envelope_the_store_refuses_even_as_quarantined_is_dropped_with_a_critical_alert(
        azurite: processes.Server) -> None:
    # Found by review: ingest sets an envelope whose rows the store refuses aside as a quarantined one; when
    # the store refused that one's rows too, the set-aside recursed without end (a RecursionError, the batch
    # retried by the host forever: its partition stalled). Now it is dropped once a critical alert of fixed
    # content is committed, and the next batch flows.
    svc = signing.central({"ApprovalStorage": azurite.extra["connection_string"],
                           "TABLE_PREFIX": "unst" + uuid.uuid4().hex[:8], "ALERT_WEBHOOK_URL": ""})
    switch = refusing_store(svc, "E-UNST")
    vm = Vm(name="unstvm0")
    scheduled = [event("E-UNST", [vm.name], "Reboot", "Scheduled", not_before=now() + timedelta(hours=1))]
    refused = svc.handle_batch([body(vm.incarnation_env(scheduled, at=now()))])
    assert any("dropped an envelope the store refuses even as quarantined" in e for e in refused.errors), \
        refused.errors
    alerts = [r for r in _alert_rows(azurite, svc) if r.get("Kind") == "unstorable"]
    assert len(alerts) == 1 and alerts[0]["Severity"] == "critical", alerts  # delivered (logged) at once
    switch["on"] = False
    flows = svc.handle_batch([body(vm.incarnation_env(scheduled, at=now()))])
    assert flows.processed == 1 and svc.state.find_event("E-UNST")[0] is not None


def test_a_store_that_refuses_every_row_fails_the_batch_and_drops_nothing(azurite: processes.Server) -> None:
    """A refusal that is not the body's (even the fixed alert row refused: a version the service does not
    take, a broken request) fails the batch, as before: the host retries it, nothing is dropped."""
    from central.store.tables import Rejected

    svc = signing.central({"ApprovalStorage": azurite.extra["connection_string"],
                           "TABLE_PREFIX": "unsa" + uuid.uuid4().hex[:8], "ALERT_WEBHOOK_URL": ""})
    switch = refusing_store(svc, "E-UNSA")
    switch["everything"] = True
    vm = Vm(name="unsavm0")
    batch = [body(vm.incarnation_env([event("E-UNSA", [vm.name], not_before=now() + timedelta(hours=1))],
                                     at=now()))]
    with pytest.raises(Rejected):
        svc.handle_batch(batch)
    switch["on"] = False
    assert svc.handle_batch(batch).processed == 1 and svc.state.find_event("E-UNSA")[0] is not None


def _alert_rows(azurite: processes.Server, svc: Any) -> list:
    from azure.data.tables import TableServiceClient

    tables = TableServiceClient.from_connection_string(azurite.extra["connection_string"])
    return list(tables.get_table_client(f"{svc.store.prefix}Alerts").list_entities())


def test_the_one_envelope_whose_rows_the_store_refuses_is_quarantined_and_the_others_applied(
        azurite: processes.Server) -> None:
    """central.runtime.ingest.one_at_a_time_if_refused end to end: the store refuses (HTTP 400 for its
    content) any State transaction holding one event's rows; of three envelopes in one batch, the other two
    are applied and that one is quarantined with the store's reason, the batch not failed."""
    import json as json_mod

    from central.store.tables import Rejected

    svc = signing.central({"ApprovalStorage": azurite.extra["connection_string"],
                           "TABLE_PREFIX": "refu" + uuid.uuid4().hex[:8], "ALERT_WEBHOOK_URL": ""})
    real = svc.store.transact

    def transact(table: str, ops: list) -> list:
        if table == "State" and any("E-REFUSED" in json_mod.dumps(op.entity, default=str) for op in ops):
            raise Rejected(0, "the service refuses this content")
        return real(table, ops)

    svc.store.transact = transact  # type: ignore[method-assign]
    later = now() + timedelta(hours=1)
    vms = [Vm(name=f"refvm{i}") for i in range(3)]
    ids = ["E-OK-0", "E-REFUSED", "E-OK-2"]
    bodies = [body(vm.incarnation_env([event(eid, [vm.name], not_before=later)], at=now()))
              for vm, eid in zip(vms, ids)]
    result = svc.handle_batch(bodies)
    assert (result.processed, result.quarantined) == (2, 1), result
    assert svc.state.find_event("E-OK-0")[0] is not None and svc.state.find_event("E-OK-2")[0] is not None
    assert svc.state.find_event("E-REFUSED")[0] is None
