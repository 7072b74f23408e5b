"""Which VM sent an envelope: the ingest gate built on central.intake.authn's pure verifier.

With a trust bundle (AUTHN_TRUST_PEM) every envelope must carry the forwarder's signature and the
VM's attested document in its Event Hubs application properties (schemas/authn.py), naming the
vmId the envelope claims to be from; anything else is refused (quarantined and alerted by ingest,
never applied). Without one, authentication is off: every envelope's claims are taken as they
come, and /api/health says so. docs/security.md ("Sender authentication") says why and how.

The verifier's cache is per instance and content-addressed (a document's SHA-256 -> what its chain
and signature checks found), so it can never change an answer: it only saves the PKCS#7 work.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Dict, Mapping, Optional, Sequence, Union

log = logging.getLogger("central.sender")  # stable: docs and queries select on it

CACHE_ENTRIES = 10_000


class SenderAuth:
    """`check(vm_id, body, properties, received)` -> "" (authenticated, or authentication off) or why not."""

    def __init__(self, trust: Optional[Any] = None) -> None:
        self.trust = trust  # central.intake.authn.TrustConfig, or None: off
        self._cache: Dict[str, Any] = {}
        self.accepted = 0
        self.refused = 0

    @classmethod
    def from_settings(cls, trust_pem: str, domains: str) -> SenderAuth:
        """Raises central.intake.authn.TrustConfigError (a one-line message) when the bundle is unusable."""
        if not trust_pem.strip():
            return cls(None)
        from central.intake import authn  # cryptography + asn1crypto: only when authentication is on

        names = [d.strip() for d in (domains or "").split(",") if d.strip()]
        names = names or list(authn.PUBLIC_CLOUD_DOMAINS)
        return cls(authn.load_trust(trust_pem, names))

    @property
    def enabled(self) -> bool:
        return self.trust is not None

    def check(self, vm_id: str, body: Union[bytes, str], properties: Optional[Mapping[Any, Any]],
              received: dt.datetime) -> str:
        if self.trust is None:
            return ""
        from central.intake import authn

        raw = body if isinstance(body, (bytes, bytearray)) else body.encode("utf-8", "surrogatepass")
        if len(self._cache) > CACHE_ENTRIES:
            self._cache.clear()  # a cache only: the next documents are verified in full again
        result = authn.verify(bytes(raw), properties, self.trust, received, vm_id, cache=self._cache)
        if result.ok:
            self.accepted += 1
            return ""
        self.refused += 1
        return f"sender not authenticated ({result.reason}): {result.detail}"  # type: ignore[union-attr]

    def status(self) -> Dict[str, Any]:
        return {"enabled": self.enabled, "accepted": self.accepted, "refused": self.refused}


def properties_of(metadata: Optional[Mapping[str, Any]], count: int) -> Sequence[Optional[Mapping[str, Any]]]:
    """Each event's application properties from the Functions host's trigger metadata: for cardinality
    many, `PropertiesArray[i]`; a missing or malformed array gives None for every event (which an
    enabled check refuses as `missing`)."""
    found = (metadata or {}).get("PropertiesArray")
    if not isinstance(found, list) or len(found) != count:
        return [None] * count
    return [p if isinstance(p, Mapping) else None for p in found]
