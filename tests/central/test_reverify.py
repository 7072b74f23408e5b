"""Issue 22, point 2: envelopes refused for a trust failure are kept, then re-verified as of the time they
were received once trust is repaired, and applied as if they had arrived then: a report a newer
incarnation superseded is recorded, not acted on; a forgery the chain failure hid is refused; none is
lost; two instances re-verifying at once apply each kept envelope at most once.

Central runs with its defaults (no operator PEM): the sandbox's test CA is the "new CA" it does not know
until the operator adds it (AUTHN_TRUST_PEM), as the CA-change runbook says (docs/security.md)."""

from __future__ import annotations

import logging
import re
from collections import Counter
from datetime import timedelta
from typing import Any, Dict, List

import pytest

from central.cli.se_fleet import render
from central.intake import reverify as planning
from central.intake.plan import Item
from central.model.envelope import BadEnvelope, Envelope
from central.runtime.service import CentralService
from central.runtime.settings import SettingsError
from central.store import held as kept
from tests.central.conftest import Env, Hook
from tests.central.factory import T0, Vm, at_once, body, event
from tests.signing import SIGNER


def _send(svc: CentralService, envs: List[Dict[str, Any]], at: Any) -> Any:
    bodies = [body(e) for e in envs]
    return svc.handle_batch(bodies, now=at, properties=SIGNER.as_claimed(bodies))


def _outage(env: Env) -> Dict[str, Any]:
    """Six envelopes refused while central does not know the signer's CA (five genuine, one whose body was
    changed after signing: a forgery the trust failure hides)."""
    broken = CentralService.from_settings(env.settings())  # the defaults: the sandbox CA is unknown
    web_0, web_1, web_2 = Vm("web_0"), Vm("web_1"), Vm("web_2")
    e1, e2 = "E1-" + web_0.vm_id[:8], "E2-" + web_1.vm_id[:8]
    assert _send(broken, [web_0.incarnation_env([event(e1, ["web_0"])], at=T0)], T0).quarantined == 1
    at = T0 + timedelta(minutes=1)
    assert _send(broken, [web_1.incarnation_env([event(e2, ["web_1"])], at=at),
                          web_0.heartbeat(at=at), web_1.heartbeat(at=at)], at).quarantined == 3
    at = T0 + timedelta(minutes=2)
    assert _send(broken, [web_1.incarnation_env([event(e2, ["web_1"])], at=at)], at).quarantined == 1
    genuine = body(web_2.heartbeat(at=at))
    tampered = genuine.replace(b'"backlog": 0', b'"backlog": 7')
    assert broken.handle_batch([tampered], now=at, properties=SIGNER.as_claimed([genuine])).quarantined == 1
    return {"broken": broken, "web_0": web_0, "web_1": web_1, "web_2": web_2, "e1": e1, "e2": e2}


def _repaired(env: Env) -> CentralService:
    return CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=SIGNER.trust_pem))


def test_kept_envelopes_are_applied_as_of_their_receive_time_once_trust_is_repaired(
        env: Env, hook: Hook) -> None:
    w = _outage(env)
    broken: CentralService = w["broken"]
    later = T0 + timedelta(minutes=3)  # health and views count as of the test's clock, not the calendar's
    expiry = broken.health(now=later)["senderAuthentication"]["trustExpiry"]  # judged at the test's clock
    assert (expiry["earliest"], expiry["daysLeft"], expiry["warning"]) == ("2028-05-25T23:49:25Z", 551, None)
    held = broken.health(now=later)["senderAuthentication"]["heldForTrust"]
    assert held["count"] == 6 and held["issuers"] == ["se-sandbox Test TLS Issuing CA 01"]
    assert held["oldest"].startswith("2026-11-21T12:00:00")
    assert broken.fleet(now=T0 + timedelta(minutes=3))["heldForTrust"]["count"] == 6
    # still broken: re-verifying keeps every row
    still = broken.reverify(now=T0 + timedelta(minutes=3))
    assert still["outcomes"]["untrusted"] == 6 and still["heldForTrust"]["count"] == 6
    assert not [r for r in env.rows("Quarantine") if r.get("Reverify")]
    assert broken.health(now=later)["senderAuthentication"]["refused"] == 6  # a re-check is not live traffic

    repaired = _repaired(env)
    web_1: Vm = w["web_1"]
    at = T0 + timedelta(minutes=5)  # web_1's next incarnation arrives before the kept ones are applied
    assert _send(repaired, [web_1.incarnation_env([event(w["e2"], ["web_1"])], at=at)], at).processed == 1
    done = repaired.reverify(now=T0 + timedelta(minutes=6))
    out = done["outcomes"]
    assert (out["verified"], out["applied"], out["superseded"], out["refused"]) == (5, 3, 2, 1), out
    assert done["heldForTrust"]["count"] == 0

    # applied as if it arrived then: web_0's event was first seen when its kept incarnation was received
    e1 = repaired.event(w["e1"], now=T0 + timedelta(minutes=6))
    assert e1["firstSeen"].startswith("2026-11-21T12:00:00"), e1
    vms = {v["name"]: v for v in repaired.fleet(now=T0 + timedelta(minutes=6))["vms"]}
    assert vms["web_0"]["lastHeartbeat"].startswith("2026-11-21T12:01:00")
    # superseded: web_1's kept incarnations 1 and 2 are recorded, not applied (3 was)
    incs = {(r["VmName"], r["Incarnation"]): r["Applied"] for r in env.rows("Incarnations")}
    assert incs[("web_1", 1)] is False and incs[("web_1", 2)] is False and incs[("web_1", 3)] is True
    assert incs[("web_0", 1)] is True
    # the forgery the trust failure hid is refused for what it is, never applied
    assert "web_2" not in vms
    rows = env.rows("Quarantine")
    assert Counter(r.get("Reverified") for r in rows) == Counter(
        {"applied": 3, "superseded": 2, "refused": 1}), [(r.get("Reverified"), r.get("Errors")) for r in rows]
    refused = next(r for r in rows if r.get("Reverified") == "refused")
    assert "signature" in refused["ReverifyReason"]
    # nothing is left, and a second run changes nothing
    again = repaired.reverify(now=T0 + timedelta(minutes=7))
    assert not any(again["outcomes"].values())


def test_two_instances_reverifying_at_once_apply_each_kept_envelope_at_most_once(
        env: Env, hook: Hook, caplog: pytest.LogCaptureFixture) -> None:
    _outage(env)
    a, b = _repaired(env), _repaired(env)
    caplog.set_level(logging.INFO, logger="central.reverify")
    later = T0 + timedelta(minutes=6)
    at_once(lambda: a.reverify(now=later), lambda: b.reverify(now=later))
    applied = Counter(m.group(1) for r in caplog.records
                      for m in [re.search(r"kept envelope (\S+) received", r.getMessage())] if m)
    assert len(applied) == 6 and set(applied.values()) == {1}, applied
    assert a.reverifier.last["raced"] + b.reverifier.last["raced"] + \
        sum(s.reverifier.last["verified"] + s.reverifier.last["refused"] for s in (a, b)) >= 6


def test_a_stale_claim_is_refused_by_its_etag(env: Env, hook: Hook) -> None:
    _outage(env)
    now = T0 + timedelta(minutes=6)
    repaired = _repaired(env)
    seen = kept.read(repaired.store, now)  # what a second instance read before the first applied them
    assert len(seen) == 6
    repaired.reverify(now=now)
    assert kept.claim(repaired.store, [(e["PartitionKey"], e["RowKey"], etag) for e, etag in seen],
                      now, "late") == {}  # all six refused by their ETags (one chunk, then one by one)


def test_the_plan_is_oldest_first_and_bounded() -> None:
    def held(n: int, body: str = "x") -> planning.Held:
        return planning.Held("p", f"r{n}", "", f"{body}{n}", {}, T0 + timedelta(minutes=n), "CA 02")

    calls: List[Any] = []

    def untrusted(text: str, at: Any, props: Dict[str, str]) -> Item:
        calls.append(at)
        bad = BadEnvelope(text, [{"path": "/", "message": "untrusted"}], "0" * 64)
        bad.extra["trustIssuer"] = "CA 02"
        return Item(bad, at)

    steps = planning.plan([held(3), held(1), held(2), planning.Held("p", "r0", "", None, None, T0)],
                          untrusted, checked=3)
    assert [s.held.row for s in steps] == ["r0", "r1", "r2"]
    assert [s.outcome for s in steps] == ["unreadable", "untrusted", "untrusted"]
    assert calls == [T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]  # verified as of receive time
    assert planning.summary([held(2), held(1)]) == {
        "count": 2, "oldest": "2026-11-21T12:01:00.000Z", "issuers": ["CA 02"]}
    dup = planning.plan([planning.Held("a", "1", "", "same", {}, T0, ""),
                         planning.Held("b", "1", "", "same", {}, T0 + timedelta(days=1), "")], untrusted)
    assert [s.outcome for s in dup] == ["untrusted", "duplicate"]

    def verified_if_even(text: str, at: Any, props: Dict[str, str]) -> Item:
        if int(text[1:]) % 2:
            return untrusted(text, at, props)
        env = Envelope("id", "t", "vm", "vm", at, {}, {})
        return Item(env, at)

    # rows that stay untrusted do not count against the rows applied per run
    mixed = planning.plan([held(n) for n in range(1, 8)], verified_if_even, limit=2)
    assert [(s.held.row, s.outcome) for s in mixed] == [
        ("r1", "untrusted"), ("r2", "verified"), ("r3", "untrusted"), ("r4", "verified")]


def test_the_timer_re_verifies_at_an_instances_first_tick_then_hourly(env: Env, hook: Hook) -> None:
    w = _outage(env)
    repaired = _repaired(env)  # a trust setting changed: the app restarted with it
    repaired.reevaluate(now=T0 + timedelta(minutes=6))
    assert repaired.reverifier.last["verified"] == 5
    late = Vm("web_9")  # still signed under the CA the broken instance does not know
    assert _send(w["broken"], [late.heartbeat(at=T0 + timedelta(minutes=10))],
                 T0 + timedelta(minutes=10)).quarantined == 1
    repaired.reevaluate(now=T0 + timedelta(minutes=30))  # within the hour: the timer does not re-read
    assert len([r for r in env.rows("Quarantine") if r.get("Reverify") != "done"]) == 1
    repaired.reevaluate(now=T0 + timedelta(minutes=67))
    assert repaired.reverifier.last["applied"] == 1
    assert [r for r in env.rows("Quarantine") if r.get("Reverify") != "done"] == []


def test_kept_envelopes_past_the_keep_window_are_given_up_counted_and_alerted(env: Env, hook: Hook) -> None:
    """Issue 45, item 3: nothing kept ages out unseen. Past AUTHN_HELD_DAYS (default 7) the timer's daily
    sweep marks each kept row given up (still in Quarantine), health counts them by VM, and one critical alert
    names how many of which VMs; a later repair applies none of them."""
    w = _outage(env)
    broken: CentralService = w["broken"]
    inside = T0 + timedelta(days=6, hours=23)
    broken.reevaluate(now=inside)  # still inside the window: nothing given up
    held = broken.health(now=inside)["senderAuthentication"]["heldForTrust"]
    assert (held["count"], held["givenUp"]["count"], held["pastWindow"], held["keptDays"]) == (6, 0, 0, 7)
    assert not [a for a in hook.alerts() if a.get("kind") == "held-given-up"]

    past = T0 + timedelta(days=8)
    held = broken.fleet(now=past)["heldForTrust"]  # past the window, before the next sweep: still counted
    assert (held["count"], held["pastWindow"]) == (0, 6), held
    broken.reevaluate(now=past)
    held = broken.health(now=past)["senderAuthentication"]["heldForTrust"]
    assert (held["count"], held["pastWindow"], held["givenUp"]["count"]) == (0, 0, 6), held
    by_vm = {w[name].vm_id: n for name, n in (("web_1", 3), ("web_0", 2), ("web_2", 1))}  # ids they claimed
    assert {v["vm"]: v["count"] for v in held["givenUp"]["vms"]} == by_vm, held
    alerts = [a for a in hook.alerts() if a.get("kind") == "held-given-up"]
    assert len(alerts) == 1 and alerts[0]["severity"] == "critical", alerts
    assert "6 envelope(s)" in alerts[0]["title"] and f"{w['web_1'].vm_id} (3)" in alerts[0]["text"], alerts[0]
    shown = render(broken.fleet(now=past))  # what `se-fleet status` prints of it
    assert "6 envelope(s) held for trust were given up unverified after 7 days" in shown, shown
    rows = env.rows("Quarantine")  # nothing deleted: each row is the record of what was given up
    assert len(rows) == 6 and {r.get("Reverified") for r in rows} == {"given-up"}, rows

    broken.reevaluate(now=past + timedelta(days=1, minutes=1))  # the next day's sweep finds nothing new
    assert len([a for a in hook.alerts() if a.get("kind") == "held-given-up"]) == 1
    done = _repaired(env).reverify(now=past + timedelta(days=1))
    assert not any(done["outcomes"].values()), done  # given up means never applied


def test_the_keep_window_is_a_checked_setting(env: Env) -> None:
    assert CentralService.from_settings(env.settings(AUTHN_HELD_DAYS="30")).reverifier.days == 30
    for bad in ("0", "366", "7.5", "a week"):
        with pytest.raises(SettingsError, match="AUTHN_HELD_DAYS must be a whole number"):
            CentralService.from_settings(env.settings(AUTHN_HELD_DAYS=bad))


def test_the_sweep_reads_only_the_partitions_health_shows(env: Env) -> None:
    """The daily sweep is bounded (never the whole Quarantine history): the SHOWN_DAYS partitions past the
    keep window, the same ones health counts as pastWindow."""
    broken = _outage(env)["broken"]
    assert len(kept.expired(broken.store, T0 + timedelta(days=9))) == 6
    assert kept.expired(broken.store, T0 + timedelta(days=kept.HELD_DAYS + kept.SHOWN_DAYS + 2)) == []


def test_the_timers_are_due_first_then_every_period_and_when_the_clock_went_back() -> None:
    from central.runtime.reverify import _due

    assert _due(None, T0, 60)
    assert not _due(T0, T0 + timedelta(seconds=59), 60) and _due(T0, T0 + timedelta(seconds=60), 60)
    assert _due(T0, T0 - timedelta(seconds=1), 60)  # not suppressed until the clock passes T0 again
