"""Which VM sent an envelope: the ingest gate built on central.intake.authn's pure verifier.

AUTHN_MODE (default `required`):
- required: every envelope must carry the forwarder's signature and the VM's attested document in its
  Event Hubs application properties (schemas/authn.py), naming the vmId the envelope claims; anything
  else is refused (quarantined and alerted by ingest, never applied);
- preferred (mid-rollout fleets): as required, except that an unsigned envelope passes this gate on
  condition: planning refuses it (`downgrade`) when the VM's State row says it has signed before
  (central.intake.downgrade: durable and shared by every instance);
- off: every envelope's claims are taken as they come. Logged as a warning at start; /api/health and
  `se-fleet status` show it.

Trust (central.intake.trust_store): certifi's DigiCert Global Root G2 and Microsoft RSA Root CA 2017,
the shipped Microsoft intermediates, AIA fetches for other issuers (central.intake.aia), plus the
operator's AUTHN_TRUST_PEM if any. docs/security.md ("Sender authentication") says why and how.

The verifier's cache is per instance and content-addressed (a document's SHA-256 -> what its chain
and signature checks found), so it can never change an answer: it only saves the PKCS#7 work.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from central.model.envelope import Envelope
from central.model.times import aware
from schemas import authn as wire

log = logging.getLogger("central.sender")  # stable: docs and queries select on it

CACHE_ENTRIES = 10_000
MODES = ("required", "preferred", "off")


class Refusal(str):
    """Why the sender check refused (the str ingest records), with its class and, for a trust failure,
    the issuer that could not be chained (what the critical alert names)."""

    kind: str = "forgery"
    issuer: str = ""


def refusal(text: str, kind: str, issuer: str = "") -> Refusal:
    out = Refusal(text)
    out.kind, out.issuer = kind, issuer
    return out


class Admitted(str):
    """An accepted envelope (the empty str ingest reads as "go on"), with how: `signed` True (verified)
    or False (unsigned, on condition: central.intake.downgrade decides on the VM's row)."""

    signed: Optional[bool] = None


def admitted(signed: bool) -> Admitted:
    out = Admitted("")
    out.signed = signed
    return out


SIGNED, UNSIGNED = admitted(True), admitted(False)


class SenderAuth:
    """`check(vm_id, body, properties, received)` -> SIGNED or UNSIGNED (both "": go on) or why not.
    After a refusal, `last` holds the authn.Rejected (its kind and issuer)."""

    def __init__(self, trust: Optional[Any] = None, mode: str = "required") -> None:
        self.trust = trust  # central.intake.authn.TrustConfig, or None: off
        self.mode = mode if trust is not None else "off"
        self._cache: Dict[str, Any] = {}
        self.accepted = 0
        self.accepted_unsigned = 0
        self.refused = 0
        self.last: Optional[Any] = None

    @classmethod
    def from_settings(cls, trust_pem: str, domains: str, mode: str = "required",
                      aia_hosts: str = "") -> SenderAuth:
        """Raises central.intake.authn.TrustConfigError (a one-line message) on an unusable setting."""
        from central.intake import attested

        mode = (mode or "required").strip().lower()
        if mode not in MODES:
            raise attested.TrustConfigError(f"AUTHN_MODE must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "off":
            log.warning("se.authn.off: sender authentication is OFF (AUTHN_MODE=off): any holder of the "
                        "hub's send right can speak for any VM (docs/security.md)")
            return cls(None, "off")
        from central.intake import aia, trust_store  # cryptography + asn1crypto: only when on

        hosts = [h.strip() for h in (aia_hosts or "").split(",") if h.strip()] or list(aia.DEFAULT_HOSTS)
        names = [d.strip() for d in (domains or "").split(",") if d.strip()] or list(attested.DEFAULT_DOMAINS)
        trust = trust_store.default_trust(trust_pem, names, fetch=aia.AiaFetcher(hosts))
        return cls(trust, mode)

    @property
    def enabled(self) -> bool:
        return self.trust is not None

    def check(self, vm_id: str, body: Union[bytes, str], properties: Optional[Mapping[Any, Any]],
              received: dt.datetime, subscriptions: Sequence[str] = (), count: bool = True) -> str:
        """`count` False: a re-verification of a kept envelope (central.runtime.reverify), which must not
        move the accepted/refused figures health shows for live traffic."""
        if self.trust is None:
            return ""
        from central.intake import authn

        raw = body if isinstance(body, (bytes, bytearray)) else body.encode("utf-8", "surrogatepass")
        if len(self._cache) > CACHE_ENTRIES:
            self._cache.clear()  # a cache only: the next documents are verified in full again
        result = authn.verify(bytes(raw), properties, self.trust, received, vm_id, cache=self._cache,
                              claimed_subscriptions=subscriptions)
        if result.ok:
            self.accepted += 1 if count else 0
            return SIGNED
        if self.mode == "preferred" and result.reason == "missing":  # type: ignore[union-attr]
            self.accepted_unsigned += 1 if count else 0  # on condition: a downgrade is refused in planning
            return UNSIGNED
        self.refused += 1 if count else 0
        self.last = result
        return refusal(f"sender not authenticated ({result.reason}): {result.detail}",  # type: ignore
                       result.kind, result.issuer)  # type: ignore[union-attr]

    def downgraded(self, count: int) -> None:
        """`count` envelopes this gate let through unsigned were refused in planning as downgrades."""
        self.accepted_unsigned -= count
        self.refused += count

    def status(self, now: Optional[dt.datetime] = None) -> Dict[str, Any]:
        """Health's view; `now` (default: the clock) dates the trust's expiry warning."""
        out: Dict[str, Any] = {"enabled": self.enabled, "mode": self.mode, "accepted": self.accepted,
                               "refused": self.refused}
        if self.trust is not None:
            from central.intake import trust_store

            out["trustExpiry"] = trust_store.expiry(self.trust, aware(now))
        if self.mode == "preferred":
            out["acceptedUnsigned"] = self.accepted_unsigned
        if self.mode == "off":
            out["warning"] = ("sender authentication is off: any holder of the hub's send right can speak "
                              "for any VM")
        return out


def properties_of(metadata: Optional[Mapping[str, Any]], count: int) -> Sequence[Optional[Mapping[str, Any]]]:
    """Each event's application properties from the Functions host's trigger metadata: for cardinality
    many, `PropertiesArray[i]`; a missing or malformed array gives None for every event (which an
    enabled check refuses as `missing`)."""
    found = (metadata or {}).get("PropertiesArray")
    if not isinstance(found, list) or len(found) != count:
        return [None] * count
    return [p if isinstance(p, Mapping) else None for p in found]


def claimed_subscriptions(env: Envelope) -> List[str]:
    """The subscriptions an envelope's VM block claims: the one its resourceId names, which must start
    `/subscriptions/<id>/` (schemas.authn.resource_id_subscription: then the policy's matching, the ARM
    owner and PLATFORM_CONFIRM_SCOPES' prefixes all read that one; a genuine forwarder sends IMDS's
    resourceId, which does; a missing or otherwise shaped one is claimed as '', which no document names),
    and its subscriptionId when given."""
    found = [wire.resource_id_subscription(env.vm.get("resourceId"))]
    if env.vm.get("subscriptionId") is not None:
        found.append(str(env.vm["subscriptionId"]))
    return list(dict.fromkeys(found))
