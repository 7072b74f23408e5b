"""Small pure parts: the settings list, queue names, large JSON columns, alert bodies, envelopes."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from central.intake import parse as envelopes
from central.model.alert import Alert
from central.runtime import approval_queue as approvals
from central.runtime.settings import catalogue
from central.runtime.webhook import payload
from central.store import tables as store

from .factory import T0, Vm, event


def test_every_setting_central_reads_is_in_the_one_list() -> None:
    source = Path(__file__).resolve().parents[2].joinpath("central", "runtime", "settings.py").read_text()
    read = set(re.findall(r'(?:s\.get|_number\(s,)\s*\(?\s*"([A-Z_]+)"', source))
    assert {"POLICY_JSON", "ALERT_WEBHOOK_URL", "TABLE_PREFIX", "APPROVAL_RESULT_TIMEOUT_SECONDS"} <= read
    listed = set(catalogue()["settings"])
    assert read - listed == set()
    prefix = catalogue()["storageConnectionPrefix"]
    for suffix in ("queueServiceUri", "tableServiceUri", "credential", "clientId"):
        assert f"{prefix}__{suffix}" in listed


@pytest.mark.parametrize("vm_id", ["2F0C8A1E-1234-4ABC-9DEF-0123456789AB", "weird__ID!!", "x" * 200, "---"])
def test_queue_names_follow_storage_rules(vm_id: str) -> None:
    name = approvals.queue_name(vm_id)
    assert re.fullmatch(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]", name), name
    assert approvals.queue_name(vm_id) == name  # deterministic
    assert (
        approvals.queue_name("2f0c8a1e-1234-4abc-9def-0123456789ab")
        == "vm-2f0c8a1e-1234-4abc-9def-0123456789ab"
    )


def test_approval_message_never_outlives_notbefore_and_validates() -> None:
    msg = approvals.build_message(
        "E1", "vm-id", "vm0", "approve", "policy:x", "why", 3, T0, T0 + timedelta(minutes=1)
    )
    assert msg["expiresAt"] > msg["issuedAt"]
    with pytest.raises(approvals.ApprovalInvalid):
        approvals.build_message("E1", "vm-id", "vm0", "reboot", "policy:x", "why", 3, T0, T0)


def test_json_columns_split_and_truncate() -> None:
    entity: dict = {}
    value = {"x": "é" * 50_000}
    store.put_json(entity, "Doc", value)
    assert entity["DocParts"] > 1 and all(
        len(v) <= store.PART_CHARS for k, v in entity.items() if k.startswith("Doc") and isinstance(v, str)
    )
    assert store.get_json(entity, "Doc") == value
    huge: dict = {}
    store.put_json(huge, "Doc", "z" * 2_000_000)
    assert huge["DocTruncated"] is True and huge["DocLength"] > 2_000_000
    assert sum(len(v) for v in huge.values() if isinstance(v, str)) * 2 <= store.MAX_JSON_BYTES
    assert store.get_json(huge, "Doc", "cut") == "cut"


def test_alert_payloads() -> None:
    alert = Alert(
        "E1:Scheduled",
        "event-status",
        "critical",
        "Reboot Scheduled: vm0",
        "text",
        T0,
        "E1",
        "Scheduled",
        {"eventId": "E1", "n": 2},
    )
    generic = payload(alert, "generic")
    assert generic["eventId"] == "E1" and generic["severity"] == "critical"
    teams = payload(alert, "teams")
    assert teams["@type"] == "MessageCard" and {"name": "n", "value": "2"} in teams["sections"][0]["facts"]
    slack = payload(alert, "slack")
    assert slack["blocks"][0]["type"] == "header" and "critical" in slack["text"]
    json.dumps([generic, teams, slack])


def test_envelope_parsing() -> None:
    vm = Vm("vm0")
    good = vm.incarnation_env([event("E1", ["vm0"])])
    parsed = envelopes.parse_body(json.dumps(good).encode())
    assert isinstance(parsed, envelopes.Envelope) and parsed.vm_id == vm.vm_id and parsed.time == T0
    bad = envelopes.parse_body(json.dumps(dict(good, partitionkey="other")))
    assert isinstance(bad, envelopes.BadEnvelope) and bad.errors[0]["path"] == "/partitionkey"
    assert isinstance(envelopes.parse_body(b"\xff\xfe"), envelopes.BadEnvelope)


@pytest.mark.parametrize("prefix", ["1abc", "a-b", "é", "a" * 41])
def test_bad_table_prefix_is_a_clear_error(prefix: str) -> None:
    from central.runtime.settings import CentralSettings, SettingsError

    with pytest.raises(SettingsError, match="TABLE_PREFIX"):
        CentralSettings.from_mapping({"TABLE_PREFIX": prefix})
    assert CentralSettings.from_mapping({"TABLE_PREFIX": "prod1"}).table_prefix == "prod1"


@pytest.mark.parametrize(("name", "value"), [
    ("ALERT_MAX_ATTEMPTS", "inf"), ("APPROVAL_RESULT_TIMEOUT_SECONDS", "nan"),
    ("REPORT_GRACE_SECONDS", "inf"),
    ("APPROVAL_RESULT_TIMEOUT_SECONDS", "0.5"), ("LEADER_LIVENESS_SECONDS", "0"),
    ("PLATFORM_CONFIRM_GRACE_SECONDS", "1e308"), ("ALERT_TIMEOUT_SECONDS", "-1"),
])
def test_a_numeric_setting_that_cannot_work_is_one_line_naming_it(name: str, value: str) -> None:
    """float() reads nan, inf and 1e308: they gave a bare OverflowError or ValueError later, naming no
    setting; a result timeout under a second sent no approval ever, a liveness of 0 elected no leader."""
    from central.runtime.settings import CentralSettings, SettingsError

    with pytest.raises(SettingsError, match=f"app setting {name} must be a number from"):
        CentralSettings.from_mapping({name: value})
    taken = CentralSettings.from_mapping({name: "30"})  # a sound value of each is taken
    assert 30 in {taken.alert_attempts, taken.result_timeout, taken.report_grace, taken.liveness,
                  taken.confirm_grace, taken.alert_timeout}


def test_leader_election_rounds() -> None:
    from datetime import timedelta

    from central.model.events import Approval, EventRecord
    from central.model.vms import VmState
    from central.policy.leader import elect

    live = timedelta(seconds=60)
    vms = {n: VmState(f"id-{n}", n, last_seen=T0) for n in ("b", "a", "c")}
    vms["c"].last_seen = T0 - timedelta(minutes=5)  # not live
    rec = EventRecord("E", T0, resources=["c", "b", "a"])
    assert elect(rec, vms, T0, live).name == "a"  # first live in sorted Resources

    def tried(name: str, result: str) -> Approval:
        return Approval(1, "m", f"id-{name}", name, "q", "approve", "p", T0, T0, result=result)

    rec.approvals = [tried("a", "timeout")]
    assert elect(rec, vms, T0, live).name == "b"
    rec.approvals = [tried("a", "timeout"), tried("b", "post-failed")]
    assert elect(rec, vms, T0, live).name == "a"  # second round: a only timed out; b could not POST
    rec.approvals = [tried("a", "post-failed"), tried("b", "post-failed")]
    assert elect(rec, vms, T0, live) is None


def test_a_vm_row_binds_its_budget_tags_once_and_keeps_an_empty_binding() -> None:
    """Tag budgets read the tags of first sight (issue 14): a row from before GroupTags binds its stored
    tags; a VM first seen without tags stays in no tag group whatever it claims later."""
    from central.model.vms import VmState
    from central.store.state_rows import vm_entity, vm_from_entity

    vm = VmState("id-1", "web_0")
    vm.bind_identity({"tags": {}})
    vm.update_tags({"tags": {"avset": "db"}})  # a later claim
    again = vm_from_entity(vm_entity(vm))
    assert again.tags == {"avset": "db"} and again.budget_tags == {}
    legacy = vm_entity(vm)
    del legacy["GroupTags"]
    assert vm_from_entity(legacy).budget_tags == {"avset": "db"}  # bound now, from the stored tags


def test_a_failed_webhook_never_writes_its_url_s_secret_path(caplog: pytest.LogCaptureFixture) -> None:
    """A Teams or Slack webhook URL is a bearer secret in its path and query; requests puts the whole URL
    in a connection error's text, which went to the log and to the Alerts rows. Now: the host only."""
    import logging
    import socket

    from central.runtime.webhook import WebhookAlerter

    with socket.socket() as probe:  # a loopback port nobody listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/services/T000/B000/XSECRETX?sig=YSIGY"
    alerter = WebhookAlerter(url=url, fmt="generic", max_attempts=1, backoff=0.0, timeout=2.0)
    alert = Alert("k", "quarantined", "warning", "t", "x", T0, "", "")
    with caplog.at_level(logging.ERROR):
        delivery = alerter.send(alert)
    assert not delivery.sent and f"127.0.0.1:{port}" in delivery.error
    for text in (delivery.error, caplog.text):
        assert "XSECRETX" not in text and "YSIGY" not in text and "/services/" not in text


def test_a_refused_segment_is_committed_one_at_a_time_and_only_the_refused_item_set_aside() -> None:
    """central.runtime.ingest.one_at_a_time_if_refused, which envelope and platform ingest share: the store
    refuses any commit holding "b"; "a" and "c" are committed alone, "b" is set aside with the store's
    reason, nothing is tried twice."""
    from central.runtime.ingest import one_at_a_time_if_refused

    committed: list = []
    set_aside: list = []

    def attempt(part: list) -> set:
        if "b" in part:
            raise store.Rejected(0, "the store refuses b")
        committed.extend(part)
        return set(part)

    def run(part: list) -> set:
        return one_at_a_time_if_refused(part, lambda: attempt(part), run,
                                        lambda item, why: set_aside.append((item, why)) or set())

    assert run(["a", "b", "c"]) == {"a", "c"}
    assert committed == ["a", "c"] and set_aside == [("b", "the store refuses b")]
