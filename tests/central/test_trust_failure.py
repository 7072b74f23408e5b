"""Issue 22, point 2 (the part built): a chain central cannot build is a trust failure, which raises one
critical alert naming the issuer and se-attest, and keeps each refused envelope with its authentication
properties and receive time. Central runs with its defaults (no operator PEM); the sandbox's test CA is
the "new CA" it does not know."""

from __future__ import annotations

import json
from datetime import timedelta

from central.runtime.service import CentralService
from tests.central.conftest import Env, Hook
from tests.central.factory import T0, Vm, body
from tests.signing import SIGNER


def test_an_unknown_ca_raises_one_critical_alert_and_keeps_the_material(env: Env, hook: Hook) -> None:
    svc = CentralService.from_settings(env.settings())  # the deployment's defaults: no PEM
    vms = [Vm(f"web_{i}") for i in range(3)]
    for n in range(2):
        at = T0 + timedelta(minutes=n)
        bodies = [body(vm.heartbeat(at=at)) for vm in vms]
        result = svc.handle_batch(bodies, now=at, properties=SIGNER.as_claimed(bodies))
        assert result.quarantined == 3
    trust = [a for a in hook.alerts() if a.get("kind") == "authn-trust"]
    assert len(trust) == 1, trust
    issuer = "se-sandbox Test TLS Issuing CA 01"  # the signer's issuer: neither shipped nor fetchable
    assert issuer in trust[0]["title"] and "se-attest" in trust[0]["text"]
    assert trust[0]["severity"] == "critical"
    rows = env.rows("Quarantine")
    assert len(rows) == 6 and {r["FailureClass"] for r in rows} == {"trust"}
    kept = json.loads(rows[0]["AuthProperties"])
    assert set(kept) == {"se-auth", "se-auth-kid", "se-auth-sig", "se-auth-pub", "se-auth-att"}
    assert all(r["EnqueuedAt"] for r in rows)
    # repaired (the operator adds the CA): the same VMs' next envelopes are accepted
    repaired = CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=SIGNER.trust_pem))
    at = T0 + timedelta(minutes=5)
    bodies = [body(vm.heartbeat(at=at)) for vm in vms]
    assert repaired.handle_batch(bodies, now=at, properties=SIGNER.as_claimed(bodies)).quarantined == 0
