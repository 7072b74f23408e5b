"""Which VM sent this envelope: a PURE verifier of the forwarder's sender authentication.

`verify(body, properties, trust, now, claimed_vm_id)` returns an `Authenticated` (the vmId Azure
vouches for, and the verified key) or a `Rejected` (a reason code and a sentence); it does no I/O.
The wire format is schemas/authn.py; why this mechanism, docs/security.md ("Sender authentication").

What is checked, in order:
1. the event names the scheme, a key id and an Ed25519 signature;
2. the key: from the attested document riding on this event (`se-auth-att` + `se-auth-pub`), else a
   key the caller verified earlier for this VM (`known`, e.g. from the shared store);
3. the attested document: a PKCS#7 SignedData whose signer certificate chains, under the Web PKI
   rules of `cryptography`, to a configured root through configured intermediates, names a DNS
   host under an allowed metadata domain (metadata.azure.com, or a sovereign cloud's), and whose
   RSA/ECDSA signature over the JSON content verifies (asn1crypto parses the CMS structure;
   cryptography checks every signature);
4. the document is current at `now` (createdOn - skew <= now <= expiresOn + skew, and inside every
   certificate's validity), its nonce is the key's (`schemas.authn.nonce_for`), and the key id is
   that nonce;
5. its vmId is the envelope's claimed data.vm.vmId;
6. the Ed25519 signature covers `SIGNING_PREFIX + body`, the exact bytes received.

`cache` (a dict the caller keeps, e.g. per instance) maps a document's SHA-256 to what steps 3's
chain and signature checks found; it is content-addressed, so it can never change an answer, and
the time checks of step 4 run on every call.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple, Union

from asn1crypto import cms
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509 import verification

from schemas import authn as wire

PUBLIC_CLOUD_DOMAINS: Tuple[str, ...] = ("metadata.azure.com",)
# Azure's signer names its region (eastus.metadata.azure.com) or the bare domain.
MAX_ATTESTATION_CHARS = 16 * 1024  # a real document is ~3 KB of base64; refuse more unparsed
MAX_CACHE_ENTRIES = 10_000
DOC_TIME_FORMAT = "%m/%d/%y %H:%M:%S %z"
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.S)
# PKCS#7 digest OIDs: the plain hash, or (as Azure's documents have it) the sha*WithRSAEncryption OID.
_DIGESTS = {"sha256": hashes.SHA256, "sha384": hashes.SHA384, "sha512": hashes.SHA512,
            "sha256_rsa": hashes.SHA256, "sha384_rsa": hashes.SHA384, "sha512_rsa": hashes.SHA512,
            "1.2.840.113549.1.1.11": hashes.SHA256, "1.2.840.113549.1.1.12": hashes.SHA384,
            "1.2.840.113549.1.1.13": hashes.SHA512}


class TrustConfigError(ValueError):
    """The trust setting cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class TrustConfig:
    roots: Tuple[x509.Certificate, ...]
    intermediates: Tuple[x509.Certificate, ...]
    domains: Tuple[str, ...] = PUBLIC_CLOUD_DOMAINS
    skew_seconds: float = 300.0
    allow_digit_nonce: bool = False  # the 10-digit nonce form: ~33 bits (docs/security.md)


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


Result = Union[Authenticated, Rejected]


class _Fail(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# ---- configuration ------------------------------------------------------------------------------

def load_trust(pem_text: str, domains: Union[str, Sequence[str]] = PUBLIC_CLOUD_DOMAINS,
               skew_seconds: float = 300.0, allow_digit_nonce: bool = False) -> TrustConfig:
    """Build the trust from a bundle of PEM certificates (self-signed ones are roots, the others
    intermediates). Newlines inside a PEM block may have been flattened to spaces by an app
    setting; both read. Raises TrustConfigError."""
    blocks = _PEM.findall(pem_text or "")
    if not blocks:
        raise TrustConfigError("the trust bundle holds no PEM certificate: set it to the roots and issuing "
                               "CAs of the IMDS attested document's signer (docs/security.md)")
    roots: List[x509.Certificate] = []
    intermediates: List[x509.Certificate] = []
    for n, block in enumerate(blocks, 1):
        try:
            der = base64.b64decode("".join(block.split()), validate=True)
            cert = x509.load_der_x509_certificate(der)
        except (binascii.Error, ValueError) as exc:
            raise TrustConfigError(f"certificate {n} of the trust bundle is not readable: {exc}") from exc
        (roots if _self_signed(cert) else intermediates).append(cert)
    if not roots:
        raise TrustConfigError("the trust bundle has no self-signed root certificate: add the root "
                               "(e.g. DigiCert Global Root G2) besides the issuing CAs")
    names = tuple(d.strip().lower().strip(".") for d in
                  (domains.split(",") if isinstance(domains, str) else domains) if d.strip())
    if not names:
        raise TrustConfigError("no metadata domain given: metadata.azure.com for Azure's public cloud")
    return TrustConfig(tuple(roots), tuple(intermediates), names, skew_seconds, allow_digit_nonce)


def _self_signed(cert: x509.Certificate) -> bool:
    if cert.issuer != cert.subject:
        return False
    try:
        cert.verify_directly_issued_by(cert)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


# ---- the verifier ---------------------------------------------------------------------------------

def verify(body: bytes, properties: Optional[Mapping[Any, Any]], trust: TrustConfig, now: dt.datetime,
           claimed_vm_id: str, known: Optional[VerifiedKey] = None,
           cache: Optional[MutableMapping[str, Any]] = None) -> Result:
    """See the module docstring. `now` is central's clock (the event's enqueued time), timezone-aware."""
    try:
        return _verify(body, _props(properties), trust, now, claimed_vm_id, known, cache)
    except _Fail as fail:
        return Rejected(fail.reason, fail.detail)


def _verify(body: bytes, props: Dict[str, str], trust: TrustConfig, now: dt.datetime, claimed_vm_id: str,
            known: Optional[VerifiedKey], cache: Optional[MutableMapping[str, Any]]) -> Result:
    if props.get(wire.PROP_VERSION) != wire.VERSION:
        raise _Fail("missing", f"no sender authentication (application property {wire.PROP_VERSION!r} "
                    f"is {props.get(wire.PROP_VERSION)!r}, want {wire.VERSION!r})")
    kid, signature = props.get(wire.PROP_KID, ""), _b64url(props, wire.PROP_SIGNATURE)
    if not kid or len(signature) != 64:
        raise _Fail("malformed", "the key id or the 64-byte Ed25519 signature is missing")
    if wire.PROP_ATTESTATION in props:
        key = _attested_key(props, trust, now, cache)
    elif known is not None and known.kid == kid:
        key = known
    else:
        raise _Fail("unknown-key", f"key {kid[:40]!r} comes without its attested document and no verified "
                    "key with that id is known for this VM")
    if key.kid != kid:
        raise _Fail("nonce", "the key id is not the nonce the attested document carries")
    _check_time(key, trust, now)
    if key.vm_id.lower() != str(claimed_vm_id).lower():
        raise _Fail("vmid", f"the attested document is for vmId {key.vm_id}, the envelope claims "
                    f"{str(claimed_vm_id)[:64]}")
    try:
        public_key = ed25519.Ed25519PublicKey.from_public_bytes(key.public_key)
        public_key.verify(signature, wire.SIGNING_PREFIX + body)
    except InvalidSignature:
        raise _Fail("signature", "the Ed25519 signature does not match the body") from None
    return Authenticated(key.vm_id, key)


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
        raise _Fail("malformed", f"application property {name!r} is not base64url") from None


def _attested_key(props: Dict[str, str], trust: TrustConfig, now: dt.datetime,
                  cache: Optional[MutableMapping[str, Any]]) -> VerifiedKey:
    att = props[wire.PROP_ATTESTATION]
    if len(att) > MAX_ATTESTATION_CHARS:
        raise _Fail("malformed", f"the attested document is over {MAX_ATTESTATION_CHARS} characters")
    public_key = _b64url(props, wire.PROP_PUBLIC_KEY)
    if len(public_key) != 32:
        raise _Fail("malformed", "the public key is not a 32-byte Ed25519 key")
    digest = hashlib.sha256(att.encode("ascii", "replace")).hexdigest()
    found = cache.get(digest) if cache is not None else None
    if found is None:
        found = _check_document(att, trust, now)
        if cache is not None:
            if len(cache) >= MAX_CACHE_ENTRIES:
                cache.clear()  # crude but bounded; a miss only costs one re-verification
            cache[digest] = found
    claims, valid_from, valid_until = found
    nonce = str(claims.get("nonce", ""))
    if nonce != wire.nonce_for(public_key) and not (
            trust.allow_digit_nonce and nonce == wire.digit_nonce_for(public_key)):
        raise _Fail("nonce", "the attested document's nonce is not this key's: the document was made for "
                    "another key (a replayed or copied document)")
    stamps = claims.get("timeStamp") if isinstance(claims.get("timeStamp"), dict) else {}
    return VerifiedKey(vm_id=str(claims.get("vmId", "")), kid=nonce, public_key=public_key,
                       subscription_id=str(claims.get("subscriptionId", "")),
                       created=_doc_time(stamps, "createdOn"), expires=_doc_time(stamps, "expiresOn"),
                       valid_from=valid_from, valid_until=valid_until, document_sha256=digest)


def _doc_time(stamps: Mapping[str, Any], name: str) -> dt.datetime:
    try:
        return dt.datetime.strptime(str(stamps[name]), DOC_TIME_FORMAT)
    except (KeyError, ValueError):
        raise _Fail("malformed", f"the attested document has no readable timeStamp.{name}") from None


def _check_time(key: VerifiedKey, trust: TrustConfig, now: dt.datetime) -> None:
    skew = dt.timedelta(seconds=trust.skew_seconds)
    if now + skew < max(key.created, key.valid_from):
        raise _Fail("not-yet-valid", f"the attested document was created {key.created.isoformat()}, after "
                    f"{now.isoformat()} (beyond the {trust.skew_seconds:g} s skew allowed)")
    if now - skew > min(key.expires, key.valid_until):
        raise _Fail("expired", f"the attested document (or its certificate) expired "
                    f"{min(key.expires, key.valid_until).isoformat()}, before {now.isoformat()}")


def _check_document(att: str, trust: TrustConfig, now: dt.datetime) -> Tuple[Dict[str, Any], dt.datetime,
                                                                             dt.datetime]:
    """Steps 3: parse, verify the signature and the chain. Returns (claims, valid_from, valid_until)."""
    try:
        der = base64.b64decode(att, validate=True)
        info = cms.ContentInfo.load(der, strict=True)
        if info["content_type"].native != "signed_data":
            raise _Fail("malformed", "the attested document is not PKCS#7 SignedData")
        signed = info["content"]
        content = signed["encap_content_info"]["content"].native
        signers = list(signed["signer_infos"])
        certs = [x509.load_der_x509_certificate(c.chosen.dump()) for c in signed["certificates"]
                 if c.name == "certificate"]
    except _Fail:
        raise
    except Exception as exc:  # noqa: BLE001 - asn1crypto raises many types on hostile DER
        raise _Fail("malformed",
                    f"the attested document is not readable PKCS#7 ({type(exc).__name__})") from None
    if not isinstance(content, bytes) or len(signers) != 1 or not certs:
        raise _Fail("malformed",
                    "the attested document must carry its content, one signer and its certificate")
    signer = signers[0]
    leaf = _signer_cert(signer, certs)
    _check_signature(signer, leaf, content)
    chain = _check_chain(leaf, certs, trust, now)
    try:
        claims = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _Fail("malformed", "the attested document's content is not JSON") from None
    if not isinstance(claims, dict) or not claims.get("vmId") or not claims.get("nonce"):
        raise _Fail("malformed", "the attested document names no vmId or no nonce")
    return (claims, max(c.not_valid_before_utc for c in chain), min(c.not_valid_after_utc for c in chain))


def _signer_cert(signer: Any, certs: List[x509.Certificate]) -> x509.Certificate:
    sid = signer["sid"]
    if sid.name != "issuer_and_serial_number":
        raise _Fail("malformed", "the signer is not named by issuer and serial number")
    serial = sid.chosen["serial_number"].native
    issuer = sid.chosen["issuer"].dump()
    for cert in certs:
        if cert.serial_number == serial and cert.issuer.public_bytes() == issuer:
            return cert
    raise _Fail("malformed", "the attested document does not carry its signer's certificate")


def _check_signature(signer: Any, leaf: x509.Certificate, content: bytes) -> None:
    if signer["signed_attrs"].native:
        # Azure signs the content itself; a document with signed attributes is not one of its.
        raise _Fail("malformed", "the attested document has signed attributes (Azure's have none)")
    digest = _DIGESTS.get(signer["digest_algorithm"]["algorithm"].native)
    if digest is None:
        raise _Fail("malformed", f"unsupported digest {signer['digest_algorithm']['algorithm'].native}")
    signature = signer["signature"].native
    public_key = leaf.public_key()
    try:
        if isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, content, padding.PKCS1v15(), digest())
        elif isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, content, ec.ECDSA(digest()))
        else:
            raise _Fail("malformed", "the signer's key is neither RSA nor ECDSA")
    except InvalidSignature:
        raise _Fail("untrusted",
                    "the attested document's signature does not verify: altered content") from None


def _check_chain(leaf: x509.Certificate, extra: List[x509.Certificate], trust: TrustConfig,
                 now: dt.datetime) -> List[x509.Certificate]:
    """The Web PKI chain to a configured root, as of `now`, for a DNS name under an allowed domain."""
    host = _signer_host(leaf, trust.domains)
    policy = (verification.PolicyBuilder().store(verification.Store(list(trust.roots)))
              .time(now.astimezone(dt.timezone.utc)).max_chain_depth(4))
    try:
        verifier = policy.build_server_verifier(x509.DNSName(host))
        return list(verifier.verify(leaf, [*trust.intermediates, *(c for c in extra if c != leaf)]))
    except verification.VerificationError as exc:
        raise _Fail("untrusted", f"the attested document's signer does not chain to a trusted root ({exc})") \
            from None


def _signer_host(leaf: x509.Certificate, domains: Tuple[str, ...]) -> str:
    """A DNS name of the signer under an allowed domain (a wildcard SAN stands for any host of it)."""
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    for name in names:
        host = name.lower()
        if host.startswith("*."):
            host = "attested." + host[2:]
        if any(host == d or host.endswith("." + d) for d in domains):
            return host
    raise _Fail("untrusted", f"the signer's names {names[:4]} are not under {', '.join(domains)}")
