"""Sender authentication material made in process the way a forwarder makes it (tests, benchmarks): an
Ed25519 key per VM, bound by an attested document the IMDS simulator's code signs with its test PKI
(sandbox.imds.attested), the key's signature over each exact body (schemas/authn.py)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from sandbox.imds.attested import AttestedDocuments, SandboxPki
from sandbox.imds.identity import Identity
from schemas import authn as wire


class Signer:
    """Signs bodies as the VM whose key it holds; `trust_pem` is what central is configured with."""

    def __init__(self, timeless: bool = False) -> None:
        """`timeless`: certificates and documents valid 2001-2060, for tests that run central at fixed
        times (a real document lives 6 hours; the checks are the same)."""
        start = dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc) if timeless else None
        self.pki = SandboxPki.generate(start=start, days=60 * 366 if timeless else 7)
        self.documents = AttestedDocuments(self.pki, lifetime=59 * 365 * 86400.0) if timeless \
            else AttestedDocuments(self.pki)
        self._created = start.timestamp() if start else None
        self._keys: Dict[str, Tuple[ed25519.Ed25519PrivateKey, bytes, str]] = {}

    @property
    def trust_pem(self) -> str:
        return self.pki.trust_pem()

    def _key(self, name: str, vm_id: str, subscription: str) -> Tuple[ed25519.Ed25519PrivateKey, bytes, str]:
        if (vm_id, subscription) not in self._keys:
            key = ed25519.Ed25519PrivateKey.generate()
            pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            ident = Identity(name, vmId=vm_id, **({"subscriptionId": subscription} if subscription else {}))
            doc = self.documents.document(name, ident, wire.nonce_for(pub), now=self._created)
            self._keys[(vm_id, subscription)] = (key, pub, doc["signature"])
        return self._keys[(vm_id, subscription)]

    def properties(self, name: str, vm_id: str, body: bytes,
                   subscription: Optional[str] = None) -> Dict[str, str]:
        """What the forwarder of VM (`name`, `vm_id`) attaches to `body`: Azure vouches for `vm_id` in
        `subscription` (None: the one the body's data.vm names, as IMDS gives a VM both; the simulator's
        default when it names none)."""
        if subscription is None:
            subscription = _claimed_subscription(body)
        key, pub, attestation = self._key(name, vm_id, subscription)
        return {
            wire.PROP_VERSION: wire.VERSION,
            wire.PROP_KID: wire.nonce_for(pub),
            wire.PROP_SIGNATURE: wire.b64url(key.sign(wire.SIGNING_PREFIX + body)),
            wire.PROP_PUBLIC_KEY: wire.b64url(pub),
            wire.PROP_ATTESTATION: attestation,
        }

    def as_claimed(self, bodies: Sequence[Union[bytes, str]]) -> List[Optional[Dict[str, str]]]:
        """Each body signed by the forwarder of the VM it names (data.vm), as that VM's forwarder would
        sign it (Azure vouches for the subscription its resourceId names, as IMDS gives both); a body that
        names no VM gets no properties (central refuses or quarantines it)."""
        out: List[Optional[Dict[str, str]]] = []
        for body in bodies:
            raw = body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass")
            try:
                vm = json.loads(raw)["data"]["vm"]
                out.append(self.properties(str(vm["name"]), str(vm["vmId"]), raw))
            except (ValueError, KeyError, TypeError):
                out.append(None)
        return out


def _claimed_subscription(body: bytes) -> str:
    """The subscription a body's data.vm names (subscriptionId, else the one in its resourceId), or ''."""
    try:
        vm = json.loads(body)["data"]["vm"]
        return str(vm.get("subscriptionId") or "") or wire.resource_id_subscription(vm.get("resourceId"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


def forwarders_sign(service: Any, signer: Signer) -> Any:
    """Make `service.handle_batch` receive what real forwarders send: each body with its VM's signature
    (when the caller gives no properties). Central checks them exactly as in Azure."""
    real: Callable[..., Any] = service.handle_batch

    def handle_batch(bodies: Sequence[Union[bytes, str]], now: Any = None, enqueued_times: Any = None,
                     properties: Any = None) -> Any:
        if properties is None:
            properties = signer.as_claimed(bodies)
        return real(bodies, now=now, enqueued_times=enqueued_times, properties=properties)

    service.handle_batch = handle_batch
    return service
