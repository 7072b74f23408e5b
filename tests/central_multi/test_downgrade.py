"""Issue 22 point 5: AUTHN_MODE=preferred never downgrades a VM that has signed, on any instance, after
any restart. "Seen signed" is the VM row's SignedAt in the State table (central.intake.downgrade), read
by planning from the row it commits under If-Match; two (or three) instances on one Azurite."""

from __future__ import annotations

from datetime import timedelta

from central.intake import downgrade
from central.store import state_rows as rows
from tests import signing
from tests.central.conftest import Env, Hook
from tests.central.factory import T0, Vm, body
from tests.signing import SIGNER

PREFERRED = {"AUTHN_MODE": "preferred"}
UNSIGNED = [{}]


def signed_at(env: Env, vm: Vm) -> object:
    state = env.tables.get_table_client(env.prefix + "State")
    return state.get_entity(rows.PARTITION, rows.vm_key(vm.vm_id)).get("SignedAt")


def test_a_fresh_instance_refuses_the_downgrade_of_a_vm_another_instance_saw_sign(
        env: Env, fleet_of, hook: Hook) -> None:
    first = fleet_of(1, **PREFERRED)[0]
    web_1 = Vm("web_1", scale_set="web")
    signed = body(web_1.heartbeat(at=T0))
    assert first.handle_batch([signed], now=T0, properties=SIGNER.as_claimed([signed])).processed == 1
    assert signed_at(env, web_1) is not None

    fresh = fleet_of(1, **PREFERRED)[0]  # a new instance (scale-out, or the first one restarted)
    later = T0 + timedelta(seconds=30)
    result = fresh.handle_batch([body(web_1.heartbeat(at=later))], now=later, properties=UNSIGNED)
    assert (result.processed, result.quarantined, result.downgrades) == (0, 1, 1), result
    assert any("(downgrade)" in r["Errors"] for r in env.rows("Quarantine"))
    vm_row = next(v for v in env.rows("Vms") if v["VmId"] == web_1.vm_id)
    assert vm_row["LastSeen"] == T0  # nothing of the unsigned envelope was applied
    status = fresh.health()["senderAuthentication"]
    assert (status["acceptedUnsigned"], status["refused"]) == (0, 1)

    # alerted under what central verified: no alert key names web_1 (issue 22 point 7)
    keys = sorted(a["key"] for a in hook.alerts())
    assert any(k.startswith("quarantined:unverified:") for k in keys), keys
    assert any(k.startswith("authn-downgrade:") for k in keys), keys
    assert not any(web_1.vm_id in k for k in keys), keys


def test_an_instance_whose_cache_predates_the_signature_loses_the_race_and_refuses(
        env: Env, fleet_of) -> None:
    inst = fleet_of(2, **PREFERRED)
    db_1 = Vm("db_1", scale_set="db")
    # instance 1 caches db_1's row while db_1 still sends unsigned (an old forwarder): accepted
    assert inst[1].handle_batch([body(db_1.heartbeat(at=T0))], now=T0, properties=UNSIGNED).processed == 1
    # db_1's forwarder is upgraded; its partition now goes to instance 0, which records the signature
    t1 = T0 + timedelta(seconds=10)
    signed = body(db_1.heartbeat(at=t1))
    assert inst[0].handle_batch([signed], now=t1, properties=SIGNER.as_claimed([signed])).processed == 1
    assert inst[1].state.vm(db_1.vm_id).signed_at is None  # instance 1's cache is stale

    t2 = T0 + timedelta(seconds=20)
    result = inst[1].handle_batch([body(db_1.heartbeat(at=t2))], now=t2, properties=UNSIGNED)
    assert (result.processed, result.downgrades) == (0, 1), result
    assert result.conflicts >= 1  # the stale row lost the If-Match; re-read, planned again, refused
    assert inst[1].state.vm(db_1.vm_id).signed_at is not None


def test_signed_under_required_is_remembered_when_a_restart_switches_to_preferred(env: Env, fleet_of) -> None:
    required = fleet_of(1)[0]  # the default mode also records SignedAt (no extra round trip: the VM row)
    app_1 = Vm("app_1", scale_set="app")
    required.handle_batch([body(app_1.heartbeat(at=T0))], now=T0)  # signed by the fixture, as forwarders do
    first = signed_at(env, app_1)
    assert first is not None

    restarted = fleet_of(1, **PREFERRED)[0]
    later = T0 + timedelta(minutes=5)
    assert restarted.handle_batch([body(app_1.heartbeat(at=later))], now=later,
                                  properties=UNSIGNED).downgrades == 1
    # a VM never seen signed is still accepted unsigned in preferred (the mode's purpose)
    old = Vm("old_1", scale_set="app")
    unsigned = restarted.handle_batch([body(old.heartbeat(at=later))], now=later, properties=UNSIGNED)
    assert unsigned.processed == 1
    # later signed envelopes keep the first time it signed
    t3 = later + timedelta(seconds=5)
    again = body(app_1.heartbeat(at=t3))
    assert restarted.handle_batch([again], now=t3, properties=SIGNER.as_claimed([again])).processed == 1
    assert signed_at(env, app_1) == first


def test_an_unsigned_copy_of_an_accepted_envelope_is_refused_not_dropped_as_a_duplicate(
        env: Env, fleet_of) -> None:
    svc = fleet_of(1, **PREFERRED)[0]
    vm = Vm("web_2", scale_set="web")
    signed = body(vm.heartbeat(at=T0))
    svc.handle_batch([signed], now=T0, properties=SIGNER.as_claimed([signed]))
    # the same bytes, stripped of their signature, then the VM's own signed copy: refused, then a duplicate
    result = svc.handle_batch([signed, signed], now=T0, properties=UNSIGNED + SIGNER.as_claimed([signed]))
    assert (result.downgrades, result.duplicates, result.processed) == (1, 1, 0), result


def test_remembering_signatures_adds_no_storage_round_trip(env: Env) -> None:
    """SignedAt rides on the VM row ingest reads and writes anyway: a warm instance's heartbeat is one
    request (the State transaction) in required mode, signed, and in preferred mode, unsigned."""
    for mode, properties in (("required", None), ("preferred", UNSIGNED)):
        svc = signing.central(env.settings(AUTHN_MODE=mode), count_requests=True)
        vm = Vm(f"rt_{mode}", scale_set="rt")
        assert svc.handle_batch([body(vm.heartbeat(at=T0))], now=T0, properties=properties).processed == 1
        assert svc.transport is not None
        before = svc.transport.requests
        later = T0 + timedelta(seconds=60)
        warm = svc.handle_batch([body(vm.heartbeat(at=later))], now=later, properties=properties)
        assert warm.processed == 1
        assert svc.transport.requests - before == 1, mode


def test_the_decision_is_pure_and_needs_only_the_row() -> None:
    at = T0 + timedelta(seconds=1)
    assert downgrade.refusal(False, at, "v") and "(downgrade)" in downgrade.refusal(False, at, "v")
    assert downgrade.refusal(False, None, "v") == ""  # never signed: preferred lets it in
    assert downgrade.refusal(True, at, "v") == "" and downgrade.refusal(None, at, "v") == ""  # signed; off
    assert downgrade.signed_since(True, None, at) == at
    assert downgrade.signed_since(True, T0, at) == T0  # the first time stays
    assert downgrade.signed_since(False, None, at) is None and downgrade.signed_since(None, None, at) is None
