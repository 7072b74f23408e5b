"""Unit tests: diff, identity, envelopes, backoff, rate limiter, config precedence."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import schemas
from forwarder import cli, envelope
from forwarder import config as cfg
from forwarder.backoff import Backoff
from forwarder.diff import diff
from forwarder.heartbeat import Heartbeat
from forwarder.identity import IdentityError, from_compute
from forwarder.imds import ImdsClient
from forwarder.outbox import Outbox
from forwarder.poller import Poller, parse, scheduled_for
from forwarder.ratelimit import RateLimiter, RateLimitTimeout

COMPUTE = {
    "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6", "name": "web_3", "location": "westeurope",
    "resourceGroupName": "rg", "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d",
    "resourceId": ("/subscriptions/8d10/resourceGroups/rg/providers/Microsoft.Compute/"
                   "virtualMachineScaleSets/web/virtualMachines/3"),
    "vmScaleSetName": "web", "placementGroupId": "pg-1", "zone": "2", "platformUpdateDomain": 1,
    "platformFaultDomain": "0", "osType": "Linux", "priority": "Spot", "evictionPolicy": "Deallocate",
    "tagsList": [{"name": "role", "value": "web"}, {"name": "drain", "value": "lb"}],
}


def event(eid: str, status: str = "Scheduled", etype: str = "Reboot", resources=("web_3",)) -> dict:
    return {"EventId": eid, "EventStatus": status, "EventType": etype, "ResourceType": "VirtualMachine",
            "Resources": list(resources),
            "NotBefore": "" if status == "Started" else "Mon, 11 Apr 2022 22:26:58 GMT",
            "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}


def doc(n: int, *events: dict) -> dict:
    return {"DocumentIncarnation": n, "Events": list(events)}


# ---- diff -----------------------------------------------------------------------------------

def test_diff_new_changed_gone() -> None:
    a, b, c = event("A"), event("B"), event("C")
    b_started = event("B", status="Started")
    d = diff(doc(1, a, b), doc(2, b_started, c))
    assert d.new == [c]
    assert d.changed == [{"before": b, "after": b_started}]
    assert d.gone == [a]


def test_diff_first_sight_all_new_and_same_is_empty() -> None:
    a = event("A")
    assert diff(None, doc(1, a)).new == [a]
    assert not diff(doc(1, a), doc(1, a))


# ---- identity -------------------------------------------------------------------------------

def test_identity_maps_compute_metadata_to_vm_object() -> None:
    vm = from_compute(COMPUTE).as_vm()
    assert vm["vmId"] == COMPUTE["vmId"] and vm["name"] == "web_3"
    assert vm["platformUpdateDomain"] == "1"  # numbers become strings as the schema wants
    assert vm["tags"] == {"role": "web", "drain": "lb"}
    assert "evictionPolicy" not in vm


def test_identity_without_vmid_is_an_error() -> None:
    with pytest.raises(IdentityError, match="vmId"):
        from_compute({"name": "x"})


def test_source_falls_back_to_vm_uri() -> None:
    vm = from_compute({"vmId": "abc", "name": "n"})
    assert vm.source == "vm://abc"


# ---- envelopes ------------------------------------------------------------------------------

def test_incarnation_envelope_is_valid_and_id_is_stable_per_content() -> None:
    vm = from_compute(COMPUTE)
    d1 = doc(2, event("A"))
    e1 = envelope.incarnation(vm, 2, 1, False, "2020-07-01", d1, diff(doc(1), d1), "2026-01-01T00:00:00.000Z")
    again = envelope.incarnation(vm, 2, 1, False, "2020-07-01", json.loads(json.dumps(d1)), diff(doc(1), d1),
                                 "2026-01-01T00:00:05.000Z")
    assert schemas.errors("envelope.schema.json", e1) == []
    assert e1["id"] == again["id"]  # a resend keeps the id
    other = doc(2, event("B"))  # a reset reusing number 2 with new content
    e2 = envelope.incarnation(vm, 2, 3, True, "2020-07-01", other, diff(d1, other),
                              "2026-01-01T00:00:09.000Z")
    assert e2["id"] != e1["id"] and e2["data"]["reset"] is True
    assert e1["source"] == COMPUTE["resourceId"] and e1["subject"] == "web_3"
    assert e1["partitionkey"] == COMPUTE["vmId"]


def test_quarantined_and_heartbeat_envelopes_are_valid() -> None:
    vm = from_compute(COMPUTE)
    q = envelope.quarantined(vm, "2020-07-01", "{not json", [{"path": "/", "message": "not JSON"}],
                             None, None, "2026-01-01T00:00:00.000Z")
    assert schemas.errors("envelope.schema.json", q) == []
    assert q["data"]["raw"] == "{not json" and q["data"]["rawTruncated"] is False
    hb = envelope.heartbeat(vm, "0.1.0", "2026-01-01T00:00:00.000Z", 4, ["A"],
                            {"backlog": 0, "dropped": 0, "lastSendAt": None, "lastError": None}, {})
    assert schemas.errors("envelope.schema.json", hb) == []


def test_an_invalid_envelope_is_refused_not_built() -> None:
    vm = from_compute(COMPUTE)
    with pytest.raises(envelope.EnvelopeInvalid, match="not published"):
        envelope.build(vm, envelope.INCARNATION, "x", {"vm": vm.as_vm()})  # data lacks required fields


# ---- parsing / validation -------------------------------------------------------------------

def test_parse_reports_malformed_and_schema_invalid() -> None:
    bad_json = parse("{\"DocumentIncarnation\": 3, ")
    assert bad_json.document is None and "not JSON" in bad_json.errors[0]["message"]
    invalid = parse(json.dumps({"DocumentIncarnation": 3,
                                "Events": [{"EventId": "A", "EventType": "Explode"}]}))
    assert invalid.incarnation == 3 and invalid.errors
    assert any("/Events/0" in e["path"] for e in invalid.errors)
    ok = parse(json.dumps({"DocumentIncarnation": "7", "Events": []}))
    assert ok.errors == [] and ok.incarnation == 7


def test_an_incarnation_of_non_ascii_digits_is_quarantined_not_a_crash() -> None:
    """'²'.isdigit() is True but int('²') raises: the poll loop must quarantine the document."""
    for text in ("²", "١٢"):  # a superscript two; Arabic-Indic one, two
        odd = parse(json.dumps({"DocumentIncarnation": text, "Events": []}))
        assert odd.incarnation is None and odd.errors


def test_scheduled_for_this_vm_only() -> None:
    d = doc(3, event("A"), event("B", status="Started"), event("C", resources=("other",)))
    assert scheduled_for(d, "web_3") == ["A"]


# ---- backoff and rate limit -----------------------------------------------------------------

def test_backoff_full_jitter_grows_to_cap() -> None:
    b = Backoff(base=0.5, cap=4.0, rng=random.Random(7))  # noqa: S311 - reproducible jitter
    ceilings, delays = [], []
    for _ in range(8):
        ceilings.append(b.ceiling())
        delays.append(b.next_delay())
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert all(0 <= d <= c for d, c in zip(delays, ceilings))
    assert len(set(delays)) == len(delays)  # jittered, not fixed
    b.reset()
    assert b.ceiling() == 0.5


def test_a_retry_after_is_waited_out_but_believed_only_up_to_a_bound() -> None:
    b = Backoff(base=0.5, cap=4.0, rng=random.Random(7))  # noqa: S311 - reproducible jitter
    assert b.delay_after(3.0) >= 3.0           # never sooner than the service asks
    assert b.delay_after(3600.0) == 4.0        # an hour's Retry-After: the cap, by default
    assert b.delay_after(3600.0, 30.0) == 30.0  # or the caller's bound (the token endpoint's 30 s)
    assert b.delay_after(1.0, 30.0) <= 4.0     # a short one: the jittered delay when it is longer
    b = Backoff(base=0.5, cap=4.0, rng=random.Random(7))  # noqa: S311
    plain = [b.next_delay() for _ in range(3)]
    b = Backoff(base=0.5, cap=4.0, rng=random.Random(7))  # noqa: S311
    assert [b.delay_after(None) for _ in range(3)] == plain  # no header: plain full jitter
    assert b.attempt == 3


def test_rate_limiter_never_exceeds_limit_in_any_window() -> None:
    now = [0.0]
    limiter = RateLimiter(limit=5, window=1.0, clock=lambda: now[0])
    granted = []
    for _ in range(20):
        try:
            limiter.acquire(timeout=0)
            granted.append(now[0])
        except RateLimitTimeout:
            pass
        now[0] += 0.05
    assert granted  # some were allowed
    for t in granted:
        assert sum(1 for u in granted if t <= u < t + 1.0) <= 5


def test_rate_limiter_blocks_then_grants() -> None:
    limiter = RateLimiter(limit=2, window=0.2)
    limiter.acquire()
    limiter.acquire()
    with pytest.raises(RateLimitTimeout):
        limiter.acquire(timeout=0.05)
    limiter.acquire(timeout=1.0)  # a slot frees after the window


def test_a_slot_counts_from_its_answer_so_a_slow_first_request_cannot_crowd_imds() -> None:
    """IMDS counts arrivals: a first request answered 0.3 s after it was sent may have arrived then, so the
    sixth may not be sent before 0.3 s + the window (counted from the send it would go at 1.0 s)."""
    now = [0.0]
    limiter = RateLimiter(limit=5, window=1.0, clock=lambda: now[0])
    slots = [limiter.acquire(timeout=0) for _ in range(5)]
    now[0] = 0.3
    limiter.answered(slots[0])  # the slow first one
    for slot in slots[1:]:
        limiter.answered(slot)
    now[0] = 1.05
    with pytest.raises(RateLimitTimeout):
        limiter.acquire(timeout=0)  # 0.3 + 1.0 > 1.05: still inside IMDS's second for the first arrival
    now[0] = 1.31
    limiter.acquire(timeout=0)
    limiter.answered(-1.0)  # a stamp already out of the window: nothing to move


# ---- config precedence ----------------------------------------------------------------------

def test_config_precedence_flag_env_file_default(tmp_path: Path) -> None:
    file = tmp_path / "config.json"
    file.write_text(json.dumps({"poll_interval": 3, "heartbeat_interval": 30, "state_dir": "/from/file",
                                "log_level": "debug"}))
    env = {"SE_FORWARDER_CONFIG": str(file), "SE_FORWARDER_POLL_INTERVAL": "2",
           "SE_FORWARDER_HEARTBEAT_INTERVAL": "20"}
    c = cfg.load({"poll_interval": "1.5"}, env)
    assert (c.poll_interval, c.source("poll_interval")) == (1.5, "flag")
    assert (c.heartbeat_interval, c.source("heartbeat_interval")) == (20.0, "env")
    assert (c.state_dir, c.source("state_dir")) == ("/from/file", "file")
    assert (c.api_version, c.source("api_version")) == ("2020-07-01", "default")
    assert c.log_level == "debug"


def test_config_errors_are_clear(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(cfg.ConfigError, match="poll_interval from env SE_FORWARDER_POLL_INTERVAL"):
        cfg.load({}, {"SE_FORWARDER_POLL_INTERVAL": "soon", "SE_FORWARDER_CONFIG": str(empty)})
    file = tmp_path / "c.json"
    file.write_text(json.dumps({"pol_interval": 1}))
    with pytest.raises(cfg.ConfigError, match=r"unknown setting.*pol_interval"):
        cfg.load({"config": str(file)}, {})
    with pytest.raises(cfg.ConfigError, match="cannot read config file"):
        cfg.load({"config": str(tmp_path / "missing.json")}, {})
    with pytest.raises(cfg.ConfigError, match="not one of"):
        cfg.load({"sink": "kafka", "config": str(empty)}, {})


def test_settings_names_follow_the_contract() -> None:
    names = {s.key: (s.flag, s.env) for s in cfg.SETTINGS}
    assert names["imds_url"] == ("--imds-url", "SE_FORWARDER_IMDS_URL")
    assert names["eventhub_connection_string"] == ("--eventhub-connection-string",
                                                   "SE_FORWARDER_EVENTHUB_CONNECTION_STRING")
    c = cfg.load({"eventhub_connection_string": "Endpoint=sb://x;SharedAccessKey=k"}, {})
    assert c.as_dict()["eventhub_connection_string"] == "***"  # a secret is never logged


# ---- heartbeat ------------------------------------------------------------------------------

def test_heartbeat_reports_drops_backlog_and_scheduled_events(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path, max_rows=2)
    vm = from_compute(COMPUTE)
    for n in (1, 2, 3):  # one more than fits: the oldest is dropped and counted
        d = doc(n, event("A"))
        outbox.put(envelope.incarnation(vm, n, None, False, "2020-07-01", d, diff(None, d),
                                        "2026-01-01T00:00:00.000Z"))
    client = ImdsClient("http://127.0.0.1:9")  # never called: the identity is already known
    poller = Poller(client, outbox)
    poller.identity, poller.last_incarnation = vm, 3
    poller.current_document = doc(3, event("A"), event("B", status="Started"))
    hb = Heartbeat(poller, outbox, client, interval=60)
    beat = hb.build()
    assert beat is not None and beat["type"] == envelope.HEARTBEAT
    assert beat["data"]["outbox"]["dropped"] == 1 and beat["data"]["outbox"]["backlog"] == 2
    assert beat["data"]["scheduledEventIds"] == ["A"] and beat["data"]["lastIncarnation"] == 3
    assert schemas.errors("envelope.schema.json", beat) == []
    assert hb.tick() is True and hb.tick() is False  # one per interval
    # The outbox is full of incarnations: the new heartbeat is the one dropped, never an incarnation.
    assert [i.type for i in outbox.peek(10)] == [envelope.INCARNATION] * 2
    assert outbox.dropped() == 2
    outbox.close()


def test_help_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["run", "--help"], ["check", "--help"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 0
        assert "--imds-url" in capsys.readouterr().out or argv == ["--help"]


# ---- daemon ---------------------------------------------------------------------------------

def test_a_failing_worker_backs_off_and_never_kills_the_daemon() -> None:
    import threading

    from forwarder.daemon import Daemon

    daemon = Daemon(join_timeout=5)
    calls: list = []
    closed: list = []

    def flaky(stop: threading.Event) -> None:
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("a bug in a step")
        daemon.stop.set()  # the third call succeeds: done

    worker = daemon.add_worker("flaky", flaky, interval=0.01)
    worker.max_backoff = 0.05
    daemon.on_close.append(lambda: closed.append(True))
    runner = threading.Thread(target=lambda: closed.append(daemon.run()))
    runner.start()
    runner.join(timeout=20)
    assert not runner.is_alive()
    assert len(calls) == 3 and worker.failures == 2
    assert closed == [True, 0]  # closers ran, then run() returned 0
