"""Issue 22, point 7: a forged envelope never silences the VM it names. Alerts about refused envelopes
are keyed by what central verified, not by what the body claims, in the stored keys and in ingest's
cache of recent keys (Ingest.raised)."""

from __future__ import annotations

from datetime import timedelta

from tests.central.conftest import Env, Hook
from tests.central.factory import T0, Vm, body
from tests.signing import SIGNER


def test_one_forged_unsigned_envelope_does_not_swallow_the_named_vms_own_quarantine_alert(
        env: Env, hook: Hook) -> None:
    svc = env.service()  # the defaults: AUTHN_MODE=required
    web_1 = Vm("web_1", scale_set="web")
    forged = body(web_1.heartbeat(at=T0))  # anyone with the hub's send right, claiming to be web_1
    svc.handle_batch([forged], now=T0, properties=[{}])
    genuine = body(web_1.quarantined("{not json", at=T0 + timedelta(seconds=30)))  # web_1's own, signed
    svc.handle_batch([genuine], now=T0 + timedelta(seconds=30), properties=SIGNER.as_claimed([genuine]))

    alerts = [a for a in hook.alerts() if a.get("kind") == "quarantined"]
    keys = sorted(a["key"] for a in alerts)
    assert len(alerts) == 2, keys
    assert any(k.startswith("quarantined:unverified:") for k in keys)
    own = [a for a in alerts if a["key"].startswith(f"quarantined:{web_1.vm_id}:")]
    assert len(own) == 1 and "IMDS on web_1" in own[0]["title"], alerts
    # the instance's cache of raised keys holds the same: the forgery under "unverified", web_1 under its own
    assert not any(web_1.vm_id in k for k in svc.ingest.raised if "unverified" in k)
    assert any(k.startswith(f"quarantined:{web_1.vm_id}:") for k in svc.ingest.raised)
    # a second forgery in the window costs nothing more (one unverified alert per window)
    svc.handle_batch([body(web_1.heartbeat(at=T0 + timedelta(seconds=40)))], now=T0 + timedelta(seconds=40),
                     properties=[{}])
    assert len([a for a in hook.alerts() if a.get("kind") == "quarantined"]) == 2
