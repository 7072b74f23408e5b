"""Sender authentication material made in process the way a forwarder makes it (tests, benchmarks): an
Ed25519 key per VM, bound by an attested document the IMDS simulator's code signs with its test PKI
(sandbox.imds.attested), the key's signature over each exact body (schemas/authn.py)."""

from __future__ import annotations

from typing import Dict, Tuple

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from sandbox.imds.attested import AttestedDocuments, SandboxPki
from sandbox.imds.identity import Identity
from schemas import authn as wire


class Signer:
    """Signs bodies as the VM whose key it holds; `trust_pem` is what central is configured with."""

    def __init__(self) -> None:
        self.pki = SandboxPki.generate()
        self.documents = AttestedDocuments(self.pki)
        self._keys: Dict[str, Tuple[ed25519.Ed25519PrivateKey, bytes, str]] = {}

    @property
    def trust_pem(self) -> str:
        return self.pki.trust_pem()

    def _key(self, name: str, vm_id: str) -> Tuple[ed25519.Ed25519PrivateKey, bytes, str]:
        if vm_id not in self._keys:
            key = ed25519.Ed25519PrivateKey.generate()
            pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            doc = self.documents.document(name, Identity(name, vmId=vm_id), wire.nonce_for(pub))
            self._keys[vm_id] = (key, pub, doc["signature"])
        return self._keys[vm_id]

    def properties(self, name: str, vm_id: str, body: bytes) -> Dict[str, str]:
        """What the forwarder of VM (`name`, `vm_id`) attaches to `body`: Azure vouches for `vm_id`."""
        key, pub, attestation = self._key(name, vm_id)
        return {
            wire.PROP_VERSION: wire.VERSION,
            wire.PROP_KID: wire.nonce_for(pub),
            wire.PROP_SIGNATURE: wire.b64url(key.sign(wire.SIGNING_PREFIX + body)),
            wire.PROP_PUBLIC_KEY: wire.b64url(pub),
            wire.PROP_ATTESTATION: attestation,
        }
