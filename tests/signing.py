"""Central as deployed (AUTHN_MODE=required, its default), fed what real forwarders send: every body
signed by the VM it names. The one trust tests add is the sandbox's test root (no real chain signs a
simulated document), as the issue allows; nothing here turns sender authentication off."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from central.runtime.service import CentralService
from sandbox.imds.signer import Signer, forwarders_sign

SIGNER = Signer(timeless=True)  # valid 2001-2060: tests run central at fixed times


def with_trust(settings: Mapping[str, str]) -> Dict[str, str]:
    out = dict(settings)
    out.setdefault("AUTHN_TRUST_PEM", SIGNER.trust_pem)
    return out


def central(settings: Mapping[str, str], **kw: Any) -> CentralService:
    """Signed by SIGNER unless the caller brings its own trust (and signs with its own signer)."""
    svc = CentralService.from_settings(with_trust(settings), **kw)
    return forwarders_sign(svc, SIGNER) if "AUTHN_TRUST_PEM" not in settings else svc


def event_data(body: bytes) -> Any:
    """An Event Hubs event as the forwarder of the VM `body` names publishes it: signed."""
    from azure.eventhub import EventData

    data = EventData(body)
    props = SIGNER.as_claimed([body])[0]
    if props:
        data.properties = dict(props)
    return data
