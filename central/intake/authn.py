"""Which VM sent this envelope: a PURE verifier of the forwarder's sender authentication.

`verify(body, properties, trust, now, claimed_vm_id)` returns an `Authenticated` (the vmId Azure
vouches for, and the verified key) or a `Rejected` (a reason code and a sentence); it does no I/O.
The wire format is schemas/authn.py; why this mechanism, docs/security.md ("Sender authentication").

What is checked, in order:
1. the event names the scheme, a key id and an Ed25519 signature;
2. the key: from the attested document riding on this event (`se-auth-att` + `se-auth-pub`), else a
   key the caller verified earlier for this VM (`known`, e.g. from the shared store);
3. the attested document (central.intake.attested): Azure's signature over its content, a signer
   named under an allowed metadata domain, and a chain to a trusted root (shipped intermediates,
   operator certificates, AIA fetches: central.intake.chain);
4. the document is current at `now` (createdOn - skew <= now <= expiresOn + skew, and inside every
   certificate's validity), its nonce is the key's (`schemas.authn.nonce_for`), and the key id is
   that nonce;
5. its vmId is the envelope's claimed data.vm.vmId, and, when it names a subscription (every document since
   2021 does), that is the subscription the envelope claims (`claimed_subscriptions`: data.vm.subscriptionId
   and the one in data.vm.resourceId, compared as ARM does, ignoring case): the policy matches on it and
   the ARM path acknowledges under it, so a VM must not choose it;
6. the Ed25519 signature covers `SIGNING_PREFIX + body`, the exact bytes received.

Every Rejected has a `reason` code and its `kind` (malformed | forgery | trust | time, see
central.intake.attested); a trust rejection names the `issuer` that could not be chained.

`cache` (a dict the caller keeps, e.g. per instance) maps a document's SHA-256 to what steps 3's
chain and signature checks found; it is content-addressed, so it can never change an answer, and
the time checks of step 4 run on every call.
"""

from __future__ import annotations

import binascii
import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, MutableMapping, Optional, Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from schemas import authn as wire

from .attested import (  # noqa: F401 - re-exported: the trust API callers know from here
    DEFAULT_DOMAINS,
    KIND_OF,
    MAX_ATTESTATION_CHARS,
    PUBLIC_CLOUD_DOMAINS,
    Fail,
    TrustConfig,
    TrustConfigError,
    check_document,
    check_window,
    load_trust,
)

MAX_CACHE_ENTRIES = 10_000


@dataclass(frozen=True)
class VerifiedKey:
    """A key Azure's document bound to a VM; the caller may store it and pass it as `known` later."""

    vm_id: str
    kid: str
    public_key: bytes
    subscription_id: str
    created: dt.datetime
    expires: dt.datetime       # the document's expiresOn
    valid_from: dt.datetime    # the latest notBefore of the certificate chain
    valid_until: dt.datetime   # the earliest notAfter of the chain
    document_sha256: str


@dataclass(frozen=True)
class Authenticated:
    vm_id: str
    key: VerifiedKey
    ok: bool = True


@dataclass(frozen=True)
class Rejected:
    reason: str     # a short code: missing, malformed, untrusted, expired, not-yet-valid, nonce, vmid, ...
    detail: str     # one sentence for the quarantine row and the alert
    ok: bool = False
    issuer: str = ""  # for a trust rejection: the issuer that could not be chained

    @property
    def kind(self) -> str:
        """malformed | forgery | trust | time"""
        return KIND_OF.get(self.reason, "forgery")


Result = Union[Authenticated, Rejected]


# ---- the verifier ---------------------------------------------------------------------------------

def verify(body: bytes, properties: Optional[Mapping[Any, Any]], trust: TrustConfig, now: dt.datetime,
           claimed_vm_id: str, known: Optional[VerifiedKey] = None,
           cache: Optional[MutableMapping[str, Any]] = None,
           claimed_subscriptions: Iterable[str] = ()) -> Result:
    """See the module docstring. `now` is central's clock (the event's enqueued time), timezone-aware."""
    try:
        result = _verify(body, _props(properties), trust, now, claimed_vm_id, known, cache)
        _check_subscription(result.key, claimed_subscriptions)
        return result
    except Fail as fail:
        return Rejected(fail.reason, fail.detail, issuer=fail.issuer)


def _verify(body: bytes, props: Dict[str, str], trust: TrustConfig, now: dt.datetime, claimed_vm_id: str,
            known: Optional[VerifiedKey], cache: Optional[MutableMapping[str, Any]]) -> Result:
    if props.get(wire.PROP_VERSION) != wire.VERSION:
        raise Fail("missing", f"no sender authentication (application property {wire.PROP_VERSION!r} "
                    f"is {props.get(wire.PROP_VERSION)!r}, want {wire.VERSION!r})")
    kid, signature = props.get(wire.PROP_KID, ""), _b64url(props, wire.PROP_SIGNATURE)
    if not kid or len(signature) != 64:
        raise Fail("malformed", "the key id or the 64-byte Ed25519 signature is missing")
    if wire.PROP_ATTESTATION in props:
        key = _attested_key(props, trust, now, cache)
    elif known is not None and known.kid == kid:
        key = known
    else:
        raise Fail("unknown-key", f"key {kid[:40]!r} comes without its attested document and no verified "
                    "key with that id is known for this VM")
    if key.kid != kid:
        raise Fail("nonce", "the key id is not the nonce the attested document carries")
    _check_time(key, trust, now)
    # exact: every row, name binding and sender check keys on the vmId as written, so a case variant of a
    # VM's own id would be a second identity that the same attested key could speak for
    if key.vm_id != str(claimed_vm_id):
        raise Fail("vmid", f"the attested document is for vmId {key.vm_id}, the envelope claims "
                    f"{str(claimed_vm_id)[:64]}")
    try:
        public_key = ed25519.Ed25519PublicKey.from_public_bytes(key.public_key)
        public_key.verify(signature, wire.SIGNING_PREFIX + body)
    except InvalidSignature:
        raise Fail("signature", "the Ed25519 signature does not match the body") from None
    return Authenticated(key.vm_id, key)


def _check_subscription(key: VerifiedKey, claimed: Iterable[str]) -> None:
    """Every subscription the envelope claims is the attested one (ignoring case, as ARM does, and nothing
    else: a claim that reads differently elsewhere would be another subscription there). `claimed` is
    central.intake.sender.claimed_subscriptions', which names a resourceId that is missing or not under
    /subscriptions/<id>/ as '' (so it cannot match)."""
    attested = key.subscription_id.lower()
    if not attested:  # documents before 2021 name none: nothing to hold the claim to
        return
    for sub in claimed:
        if sub.lower() != attested:
            raise Fail("subscription", f"the attested document is for subscription {key.subscription_id}, "
                        f"the envelope claims {sub[:64]!r}")


def _props(properties: Optional[Mapping[Any, Any]]) -> Dict[str, str]:
    """Application properties as the SDK (bytes keys/values) or the Functions host (str) hands them."""
    out: Dict[str, str] = {}
    for k, v in (properties or {}).items():
        key = k.decode("utf-8", "replace") if isinstance(k, (bytes, bytearray)) else str(k)
        if key in wire.PROPERTIES:
            out[key] = v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)
    return out


def _b64url(props: Dict[str, str], name: str) -> bytes:
    try:
        return wire.from_b64url(props.get(name, ""))
    except (ValueError, binascii.Error):
        raise Fail("malformed", f"application property {name!r} is not base64url") from None


def _attested_key(props: Dict[str, str], trust: TrustConfig, now: dt.datetime,
                  cache: Optional[MutableMapping[str, Any]]) -> VerifiedKey:
    att = props[wire.PROP_ATTESTATION]
    if len(att) > MAX_ATTESTATION_CHARS:
        raise Fail("malformed", f"the attested document is over {MAX_ATTESTATION_CHARS} characters")
    public_key = _b64url(props, wire.PROP_PUBLIC_KEY)
    if len(public_key) != 32:
        raise Fail("malformed", "the public key is not a 32-byte Ed25519 key")
    digest = hashlib.sha256(att.encode("ascii", "replace")).hexdigest()
    found = cache.get(digest) if cache is not None else None
    if found is None:
        doc = check_document(att, trust, now)
        found = (doc.claims, doc.created, doc.expires, doc.valid_from, doc.valid_until)
        if cache is not None:
            if len(cache) >= MAX_CACHE_ENTRIES:
                cache.clear()  # crude but bounded; a miss only costs one re-verification
            cache[digest] = found
    claims, created, expires, valid_from, valid_until = found
    nonce = str(claims.get("nonce", ""))
    if nonce != wire.nonce_for(public_key) and not (
            trust.allow_digit_nonce and nonce == wire.digit_nonce_for(public_key)):
        raise Fail("nonce", "the attested document's nonce is not this key's: the document was made for "
                    "another key (a replayed or copied document)")
    return VerifiedKey(vm_id=str(claims.get("vmId", "")), kid=nonce, public_key=public_key,
                       subscription_id=str(claims.get("subscriptionId", "")), created=created,
                       expires=expires,
                       valid_from=valid_from, valid_until=valid_until, document_sha256=digest)


def _check_time(key: VerifiedKey, trust: TrustConfig, now: dt.datetime) -> None:
    check_window(key.created, key.expires, key.valid_from, key.valid_until, now, trust.skew_seconds)
