"""Azure's IMDS attested document: is it genuine, and for which VM? The document half of sender
authentication (central.intake.authn checks the envelope's key and signature against it; se-attest
checks one document on its own).

`check_document(att, trust, now)` parses the PKCS#7 SignedData (asn1crypto), verifies Azure's RSA
signature over the JSON content with the signer certificate it carries, checks that certificate names
a host under an allowed metadata domain, and builds its chain (central.intake.chain) to a trusted root
as of `now`. It returns a `Document` or raises `Fail`, whose `kind` is one of:
- malformed: not a parseable document;
- forgery: a signature that does not verify, a signer outside the cloud's metadata domain (and, in
  authn: a wrong vmId, nonce, key or envelope signature, or no authentication at all);
- trust: a chain that cannot be built, or an unknown issuer (`Fail.issuer` names it);
- time: `now` outside the signer certificate's validity or the document's timeStamp window.
A trust failure is the one an operator can fix (a CA change); the others are the sender's.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from asn1crypto import cms
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from . import chain as chains

PUBLIC_CLOUD_DOMAINS: Tuple[str, ...] = ("metadata.azure.com",)
# What a deployment allows when nothing says otherwise: Azure's public cloud and Azure Government,
# the two clouds whose signers chain to DigiCert Global Root G2 (21Vianet needs an operator PEM).
DEFAULT_DOMAINS: Tuple[str, ...] = ("metadata.azure.com", "metadata.azure.us")
MAX_ATTESTATION_CHARS = 16 * 1024  # a real document is ~3-4 KB of base64; refuse more unparsed
DOC_TIME_FORMAT = "%m/%d/%y %H:%M:%S %z"
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.S)
# PKCS#7 digest OIDs: the plain hash, or (as Azure's documents have it) the sha*WithRSAEncryption OID.
_DIGESTS = {"sha256": hashes.SHA256, "sha384": hashes.SHA384, "sha512": hashes.SHA512,
            "sha256_rsa": hashes.SHA256, "sha384_rsa": hashes.SHA384, "sha512_rsa": hashes.SHA512,
            "1.2.840.113549.1.1.11": hashes.SHA256, "1.2.840.113549.1.1.12": hashes.SHA384,
            "1.2.840.113549.1.1.13": hashes.SHA512}

# reason code -> class (the codes are stable: quarantine rows, alerts and tests name them)
KIND_OF: Dict[str, str] = {
    "malformed": "malformed",
    "missing": "forgery", "unknown-key": "forgery", "nonce": "forgery", "vmid": "forgery",
    "subscription": "forgery",
    "signature": "forgery", "forged": "forgery", "domain": "forgery", "downgrade": "forgery",
    "untrusted": "trust",
    "expired": "time", "not-yet-valid": "time",
}


class TrustConfigError(ValueError):
    """The trust setting cannot be used; the message says what to fix."""


class Fail(Exception):
    def __init__(self, reason: str, detail: str, issuer: str = "") -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.issuer = issuer

    @property
    def kind(self) -> str:
        return KIND_OF.get(self.reason, "forgery")


@dataclass(frozen=True)
class TrustConfig:
    roots: Tuple[x509.Certificate, ...]
    intermediates: Tuple[x509.Certificate, ...]
    domains: Tuple[str, ...] = PUBLIC_CLOUD_DOMAINS
    skew_seconds: float = 300.0
    allow_digit_nonce: bool = False  # the 10-digit nonce form: ~33 bits (docs/security.md)
    # where each certificate came from, by SHA-256 fingerprint: shipped | certifi | operator | fetched
    sources: Dict[bytes, str] = field(default_factory=dict, compare=False, hash=False)
    fetch: Optional[chains.Fetch] = field(default=None, compare=False, hash=False)  # AIA; None = offline

    def source(self, cert: x509.Certificate) -> str:
        return self.sources.get(cert.fingerprint(hashes.SHA256()), "operator")


@dataclass(frozen=True)
class Document:
    claims: Dict[str, Any]
    chain: Tuple[x509.Certificate, ...]
    sources: Tuple[str, ...]
    created: dt.datetime
    expires: dt.datetime
    valid_from: dt.datetime   # the latest notBefore of the chain
    valid_until: dt.datetime  # the earliest notAfter of the chain


# ---- configuration ------------------------------------------------------------------------------

def read_pem(pem_text: str, what: str = "the trust bundle") -> List[x509.Certificate]:
    """Certificates of a PEM bundle. Newlines inside a block may have been flattened to spaces by an
    app setting; both read. Raises TrustConfigError."""
    out = []
    for n, block in enumerate(_PEM.findall(pem_text or ""), 1):
        try:
            der = base64.b64decode("".join(block.split()), validate=True)
            out.append(x509.load_der_x509_certificate(der))
        except (binascii.Error, ValueError) as exc:
            raise TrustConfigError(f"certificate {n} of {what} is not readable: {exc}") from exc
    return out


def load_trust(pem_text: str, domains: Union[str, Sequence[str]] = PUBLIC_CLOUD_DOMAINS,
               skew_seconds: float = 300.0, allow_digit_nonce: bool = False) -> TrustConfig:
    """Trust ONLY a bundle of PEM certificates (self-signed = root, the others intermediates). The
    deployment's default trust (shipped + certifi + operator PEM + AIA) is central.intake.trust_store."""
    certs = read_pem(pem_text)
    if not certs:
        raise TrustConfigError("the trust bundle holds no PEM certificate: set it to the roots and issuing "
                               "CAs of the IMDS attested document's signer (docs/security.md)")
    roots = [c for c in certs if self_signed(c)]
    if not roots:
        raise TrustConfigError("the trust bundle has no self-signed root certificate: add the root "
                               "(e.g. DigiCert Global Root G2) besides the issuing CAs")
    return TrustConfig(tuple(roots), tuple(c for c in certs if c not in roots), domain_list(domains),
                       skew_seconds, allow_digit_nonce)


def domain_list(domains: Union[str, Sequence[str]]) -> Tuple[str, ...]:
    names = tuple(d.strip().lower().strip(".") for d in
                  (domains.split(",") if isinstance(domains, str) else domains) if d.strip())
    if not names:
        raise TrustConfigError("no metadata domain given: metadata.azure.com for Azure's public cloud")
    return names


def self_signed(cert: x509.Certificate) -> bool:
    """A root: names itself as issuer and its signature is not shown wrong. An anchor's own signature
    carries no trust (the configuration does), so an old SHA-1 self-signature still makes a root."""
    if cert.issuer != cert.subject:
        return False
    try:
        cert.verify_directly_issued_by(cert)
    except InvalidSignature:
        return False
    except (ValueError, TypeError):
        return True  # e.g. sha1WithRSA, which cryptography no longer verifies
    return True


# ---- the document -------------------------------------------------------------------------------

def check_document(att: str, trust: TrustConfig, now: dt.datetime) -> Document:
    """Parse, verify Azure's signature, the signer's domain and its chain as of `now`. Raises Fail.
    The document's own timeStamp window is not checked here (see `check_window`)."""
    if len(att) > MAX_ATTESTATION_CHARS:
        raise Fail("malformed", f"the attested document is over {MAX_ATTESTATION_CHARS} characters")
    try:
        der = base64.b64decode(att, validate=True)
        info = cms.ContentInfo.load(der, strict=True)
        if info["content_type"].native != "signed_data":
            raise Fail("malformed", "the attested document is not PKCS#7 SignedData")
        signed = info["content"]
        content = signed["encap_content_info"]["content"].native
        signers = list(signed["signer_infos"])
        certs = [x509.load_der_x509_certificate(c.chosen.dump()) for c in signed["certificates"]
                 if c.name == "certificate"]
    except Fail:
        raise
    except Exception as exc:  # noqa: BLE001 - asn1crypto raises many types on hostile DER
        raise Fail("malformed",
                   f"the attested document is not readable PKCS#7 ({type(exc).__name__})") from None
    if not isinstance(content, bytes) or len(signers) != 1 or not certs:
        raise Fail("malformed",
                   "the attested document must carry its content, one signer and its certificate")
    signer = signers[0]
    leaf = _signer_cert(signer, certs)
    _check_signature(signer, leaf, content)
    host = signer_host(leaf, trust.domains)
    _check_leaf_time(leaf, now)
    try:
        built = chains.build(leaf, host, now, [(c, trust.source(c)) for c in trust.roots],
                             [*((c, trust.source(c)) for c in trust.intermediates),
                              *((c, "document") for c in certs if c != leaf)], trust.fetch)
    except chains.ChainError as exc:
        raise Fail("untrusted", f"the attested document's signer does not chain to a trusted root: "
                   f"{exc.detail}", exc.issuer) from None
    try:
        claims = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Fail("malformed", "the attested document's content is not JSON") from None
    if not isinstance(claims, dict) or not claims.get("vmId") or not claims.get("nonce"):
        raise Fail("malformed", "the attested document names no vmId or no nonce")
    stamps = claims.get("timeStamp") if isinstance(claims.get("timeStamp"), dict) else {}
    return Document(claims, built.chain, built.sources, doc_time(stamps, "createdOn"),
                    doc_time(stamps, "expiresOn"), max(c.not_valid_before_utc for c in built.chain),
                    min(c.not_valid_after_utc for c in built.chain))


def check_window(created: dt.datetime, expires: dt.datetime, valid_from: dt.datetime,
                 valid_until: dt.datetime, now: dt.datetime, skew_seconds: float) -> None:
    """`now` inside the document's timeStamp window and every certificate's validity (with skew)."""
    skew = dt.timedelta(seconds=skew_seconds)
    if now + skew < max(created, valid_from):
        raise Fail("not-yet-valid", f"the attested document was created {created.isoformat()}, after "
                   f"{now.isoformat()} (beyond the {skew_seconds:g} s skew allowed)")
    if now - skew > min(expires, valid_until):
        raise Fail("expired", f"the attested document (or its certificate) expired "
                   f"{min(expires, valid_until).isoformat()}, before {now.isoformat()}")


def doc_time(stamps: Dict[str, Any], name: str) -> dt.datetime:
    try:
        return dt.datetime.strptime(str(stamps[name]), DOC_TIME_FORMAT)
    except (KeyError, ValueError):
        raise Fail("malformed", f"the attested document has no readable timeStamp.{name}") from None


def _check_leaf_time(leaf: x509.Certificate, now: dt.datetime) -> None:
    """A signer certificate outside its validity is a time failure, not a trust one: asking the
    operator to repair trust for an expired (or clock-skewed) document would send them the wrong way."""
    if now < leaf.not_valid_before_utc:
        raise Fail("not-yet-valid", "the signer certificate is valid from "
                   f"{leaf.not_valid_before_utc.isoformat()}, after {now.isoformat()}")
    if now > leaf.not_valid_after_utc:
        raise Fail("expired", "the signer certificate expired "
                   f"{leaf.not_valid_after_utc.isoformat()}, before {now.isoformat()}")


def _signer_cert(signer: Any, certs: List[x509.Certificate]) -> x509.Certificate:
    sid = signer["sid"]
    if sid.name != "issuer_and_serial_number":
        raise Fail("malformed", "the signer is not named by issuer and serial number")
    serial = sid.chosen["serial_number"].native
    issuer = sid.chosen["issuer"].dump()
    for cert in certs:
        if cert.serial_number == serial and cert.issuer.public_bytes() == issuer:
            return cert
    raise Fail("malformed", "the attested document does not carry its signer's certificate")


def _check_signature(signer: Any, leaf: x509.Certificate, content: bytes) -> None:
    if signer["signed_attrs"].native:
        # Azure signs the content itself; a document with signed attributes is not one of its.
        raise Fail("malformed", "the attested document has signed attributes (Azure's have none)")
    digest = _DIGESTS.get(signer["digest_algorithm"]["algorithm"].native)
    if digest is None:
        raise Fail("malformed", f"unsupported digest {signer['digest_algorithm']['algorithm'].native}")
    signature = signer["signature"].native
    public_key = leaf.public_key()
    try:
        if isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, content, padding.PKCS1v15(), digest())
        elif isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, content, ec.ECDSA(digest()))
        else:
            raise Fail("malformed", "the signer's key is neither RSA nor ECDSA")
    except InvalidSignature:
        raise Fail("forged", "the attested document's signature does not verify: altered content") from None


def signer_host(leaf: x509.Certificate, domains: Tuple[str, ...]) -> str:
    """A DNS name of the signer under an allowed domain (a wildcard SAN stands for any host of it).
    Only the SAN counts (as in TLS): a CN alone (Microsoft's self-signed docs sample) is no name."""
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
    raise Fail("domain", f"the signer's names {names[:4]} are not under {', '.join(domains)}")
