"""AUTHN_MODE: required (default) refuses unsigned; preferred accepts unsigned only from a VM never seen
signed, and never downgrades one that signed; off warns at start and shows in /api/health and the fleet
view (se-fleet status). A bad mode is one actionable line at start."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Dict, Optional

import pytest

from central.cli.se_fleet import render
from central.runtime.service import CentralService
from central.runtime.settings import SettingsError
from tests.central.conftest import Env
from tests.central.factory import T0, Vm, body, event
from tests.signing import SIGNER


def test_required_is_the_default_and_refuses_unsigned(env: Env) -> None:
    svc = CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=SIGNER.trust_pem))
    assert svc.health()["senderAuthentication"]["mode"] == "required"
    assert svc.handle_batch([body(Vm("a").heartbeat(at=T0))], now=T0, properties=[{}]).quarantined == 1


def test_an_envelope_claiming_another_subscription_than_its_document_is_refused(env: Env) -> None:
    """A genuine key of a VM in subscription A, on an envelope whose vm.resourceId names subscription B
    (what the policy matches and the ARM path acknowledges under): quarantined, nothing of it applied."""
    svc = CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=SIGNER.trust_pem))
    vm = Vm("a", subscription="bbbb")
    raw = body(vm.incarnation_env([event("E-1", ["a"])]))
    forged = SIGNER.properties(vm.name, vm.vm_id, raw, subscription="aaaa")
    result = svc.handle_batch([raw], now=T0, properties=[forged])
    assert (result.processed, result.quarantined) == (0, 1)
    assert any("(subscription)" in r["Errors"] for r in env.rows("Quarantine"))
    assert svc.state.find_event("E-1") == (None, False)
    genuine = svc.handle_batch([raw], now=T0, properties=SIGNER.as_claimed([raw]))
    assert (genuine.processed, genuine.quarantined) == (1, 0)


@pytest.mark.parametrize("resource_id", [
    "//subscriptions/aaaa/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/a",  # read apart
    "/subscriptions/ aaaa/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/a",
    "subscriptions/aaaa/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/a",
    None,  # no resourceId: no subscription the policy, the ARM path or PLATFORM_CONFIRM_SCOPES could read
])
def test_a_resource_id_not_plainly_under_the_attested_subscription_is_refused(
        env: Env, resource_id: Optional[str]) -> None:
    svc = CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=SIGNER.trust_pem))
    vm = Vm("a", subscription="aaaa")
    doc = vm.heartbeat(at=T0)
    if resource_id is None:
        del doc["data"]["vm"]["resourceId"]
    else:
        doc["data"]["vm"]["resourceId"] = resource_id
    raw = body(doc)
    result = svc.handle_batch([raw], now=T0, properties=[SIGNER.properties("a", vm.vm_id, raw, "aaaa")])
    assert (result.processed, result.quarantined) == (0, 1)
    assert svc.state.vm(vm.vm_id) is None


def test_a_signed_envelope_replaces_a_resource_id_bound_unsigned(env: Env) -> None:
    """AUTHN_MODE=preferred binds a VM's first, unsigned, envelope as it comes; once the VM signs, a
    resourceId in the subscription Azure's document vouches for replaces one bound in another (the policy
    and the ARM path read it); a signed envelope cannot move its VM to another resource group."""
    svc = CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=SIGNER.trust_pem, AUTHN_MODE="preferred"))
    claimed, genuine = Vm("a", subscription="bbbb"), Vm("a", subscription="aaaa")
    genuine.vm_id = claimed.vm_id
    assert svc.handle_batch([body(claimed.heartbeat(at=T0))], now=T0, properties=[{}]).processed == 1
    assert "/subscriptions/bbbb/" in svc.state.vm(claimed.vm_id).resource_id
    signed = body(genuine.heartbeat(at=T0))
    assert svc.handle_batch([signed], now=T0, properties=SIGNER.as_claimed([signed])).processed == 1
    assert "/subscriptions/aaaa/" in svc.state.vm(claimed.vm_id).resource_id
    # within its subscription the resourceId stays as first seen: the resource group is not attested
    doc = genuine.heartbeat(at=T0 + timedelta(seconds=1))
    doc["data"]["vm"]["resourceId"] = doc["data"]["vm"]["resourceId"].replace("/rg/", "/elsewhere/")
    moved = body(doc)
    later = T0 + timedelta(seconds=1)
    assert svc.handle_batch([moved], now=later, properties=SIGNER.as_claimed([moved])).processed == 1
    assert "/resourceGroups/rg/" in svc.state.vm(claimed.vm_id).resource_id


def test_preferred_accepts_unsigned_only_from_vms_never_seen_signed(env: Env) -> None:
    svc = CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=SIGNER.trust_pem, AUTHN_MODE="preferred"))
    old, new = Vm("old-forwarder"), Vm("new-forwarder")
    assert svc.handle_batch([body(old.heartbeat(at=T0))], now=T0, properties=[{}]).quarantined == 0
    signed = body(new.heartbeat(at=T0))
    assert svc.handle_batch([signed], now=T0, properties=SIGNER.as_claimed([signed])).quarantined == 0
    downgrade = svc.handle_batch([body(new.heartbeat(at=T0))], now=T0, properties=[{}])
    assert downgrade.quarantined == 1
    rows = env.rows("Quarantine")
    assert any("(downgrade)" in r["Errors"] for r in rows)
    status = svc.health(now=T0)["senderAuthentication"]
    assert status["mode"] == "preferred" and status["acceptedUnsigned"] == 1


def test_off_warns_at_start_and_shows_in_health_and_fleet(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="central.sender"):
        svc = CentralService.from_settings(env.settings(AUTHN_MODE="off"))
    assert any("se.authn.off" in r.getMessage() for r in caplog.records)
    status = svc.health(now=T0)["senderAuthentication"]
    assert status["mode"] == "off" and status["enabled"] is False and "warning" in status
    fleet = svc.fleet(T0)
    assert fleet["authnMode"] == "off"
    assert "WARNING: sender authentication is OFF" in render(fleet)


def test_a_bad_mode_is_one_line_at_start(env: Env) -> None:
    with pytest.raises(SettingsError, match="AUTHN_MODE must be one of required, preferred, off"):
        CentralService.from_settings(env.settings(AUTHN_MODE="maybe"))


def test_a_flood_of_refused_envelopes_logs_a_line_per_batch_not_per_envelope(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """Anything that may send to the hub can send unsigned envelopes naming any vmIds: each is quarantined
    (a row each), but the log (billed per record) gets one `se.quarantined` line for the batch, each VM
    with its count, which the workbook's query sums."""
    svc = CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=SIGNER.trust_pem))
    vms = [Vm(f"vm{i}") for i in range(100)]
    bodies = [body(vm.heartbeat(at=T0)) for vm in vms]
    bodies.append(body(vms[0].heartbeat(at=T0 + timedelta(seconds=1))))
    with caplog.at_level(logging.INFO):
        result = svc.handle_batch(bodies, now=T0, properties=[{}] * len(bodies))
    assert result.quarantined == 101 and len(env.rows("Quarantine")) == 101
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("se.quarantined ")]
    # (one line per commit: a VM's second envelope goes in the batch's next segment)
    assert len(lines) == 2 and all(line.startswith("se.quarantined origin=central vmId=") for line in lines)
    counts: Dict[str, int] = {}
    for vm_id, n in re.findall(r"vmId=(\S+) count=([0-9]+)", " ".join(lines)):
        counts[vm_id] = counts.get(vm_id, 0) + int(n)
    assert counts == {vm.vm_id: (2 if vm is vms[0] else 1) for vm in vms}
