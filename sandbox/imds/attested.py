"""`/metadata/attested/document`: Azure's signed statement of which VM asks, signed by a LOCAL test PKI.

The real endpoint answers `{"encoding": "pkcs7", "signature": "<base64 DER>"}`: a PKCS#7 SignedData
whose encapsulated content is compact JSON (`nonce`, `plan`, `sku`, `subscriptionId`, `timeStamp`
{`createdOn`, `expiresOn`} as "MM/DD/YY HH:MM:SS -0000", `vmId`), signed with RSA/SHA-256 over the
content itself (no signed attributes), carrying only the signer's certificate (subject
metadata.azure.com, a regional SAN such as eastus.metadata.azure.com, a TLS issuing CA above it).

Here a root -> intermediate -> leaf chain of the same shape is generated at start-up, in memory; the
private keys never touch the disk. `trust_pem()` (root + intermediate certificates, public) is what
central is told to trust; `--attestation-dir` writes it as `trust.pem` for other processes.

Our choices where the docs are silent: a nonce must be 1-32 ASCII letters/digits (the REST spec's
form; Microsoft's article says "a 10-digit string", which fits), else 400; without a nonce the
document carries the UTC time as "YYYYMMDD-HHMMSS" (as the docs' sample shows); documents live
`lifetime` seconds (6 h, as observed on Azure); `cache_seconds` > 0 reproduces the documented
"a previously cached nonce value may be returned" (the same document for that long, whatever nonce).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID

from .identity import Identity

NONCE = re.compile(r"[A-Za-z0-9]{1,32}")
DEFAULT_LIFETIME = 6 * 3600.0
SIGNER_DOMAIN = "metadata.azure.com"
TIME_FORMAT = "%m/%d/%y %H:%M:%S -0000"


class BadNonce(ValueError):
    """The nonce is not 1-32 letters/digits."""


@dataclass
class _Issued:
    key: Any
    cert: x509.Certificate


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "se-sandbox test PKI (not Microsoft)")])


def _issue(subject: str, issuer: Optional[_Issued], ca: bool, now: dt.datetime, days: int,
           san: Tuple[str, ...] = (), aia: str = "") -> _Issued:
    """One certificate of the chain, following the Web PKI profile a real TLS chain has. `aia`: the
    "CA Issuers" URL where its issuer's certificate can be fetched (as Microsoft's carry)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    signer_key = issuer.key if issuer else key
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject))
               .issuer_name(issuer.cert.subject if issuer else _name(subject))
               .public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(hours=1))
               .not_valid_after(now + dt.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False)
    if aia:
        builder = builder.add_extension(x509.AuthorityInformationAccess([x509.AccessDescription(
            AuthorityInformationAccessOID.CA_ISSUERS, x509.UniformResourceIdentifier(aia))]), critical=False)
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True)
    else:
        builder = (builder
                   .add_extension(x509.KeyUsage(
                       digital_signature=True, content_commitment=False, key_encipherment=True,
                       data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                       encipher_only=False, decipher_only=False), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in san]),
                                  critical=False))
    return _Issued(key, builder.sign(signer_key, hashes.SHA256()))


@dataclass
class SandboxPki:
    """A root, an intermediate and a signing leaf, made fresh for each simulator run."""

    root: _Issued
    intermediate: _Issued
    leaf: _Issued

    @classmethod
    def generate(cls, region: str = "westeurope", domain: str = SIGNER_DOMAIN,
                 start: Optional[dt.datetime] = None, days: int = 7) -> SandboxPki:
        """`start`/`days`: the leaf's validity (from an hour before `start`, default now); CAs outlive it."""
        now = start or dt.datetime.now(dt.timezone.utc)
        root = _issue("se-sandbox Test Root", None, True, now, days=days + 23)
        intermediate = _issue("se-sandbox Test TLS Issuing CA 01", root, True, now, days=days + 23)
        leaf = _issue(domain, intermediate, False, now, days=days, san=(f"{region}.{domain}", domain))
        return cls(root, intermediate, leaf)

    def trust_pem(self) -> str:
        """The root and intermediate certificates (public): what a verifier is configured with."""
        return "".join(c.cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
                       for c in (self.root, self.intermediate))

    def write_trust(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "trust.pem"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.trust_pem(), encoding="ascii")
        tmp.replace(path)  # readers never see half a file
        return path

    def sign(self, content: bytes) -> bytes:
        """PKCS#7 SignedData as Azure makes it: content inside, no signed attributes, leaf cert only."""
        return (pkcs7.PKCS7SignatureBuilder().set_data(content)
                .add_signer(self.leaf.cert, self.leaf.key, hashes.SHA256())
                .sign(serialization.Encoding.DER,
                      [pkcs7.PKCS7Options.NoAttributes, pkcs7.PKCS7Options.Binary]))


def content(identity: Identity, nonce: str, created: float, lifetime: float) -> bytes:
    """The signed JSON, compact, with the documented fields in Azure's order."""
    def stamp(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime(TIME_FORMAT)

    doc: Dict[str, Any] = {
        "nonce": nonce,
        "plan": {"name": "", "product": "", "publisher": ""},
        "sku": "22_04-lts-gen2",
        "subscriptionId": identity.subscriptionId,
        "timeStamp": {"createdOn": stamp(created), "expiresOn": stamp(created + lifetime)},
        "vmId": identity.vmId,
    }
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


@dataclass
class AttestedDocuments:
    """Answers the route for every simulated VM; thread-safe (the server is threaded)."""

    pki: SandboxPki
    lifetime: float = DEFAULT_LIFETIME
    cache_seconds: float = 0.0
    _cache: Dict[str, Tuple[float, Dict[str, str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    issued: List[Tuple[str, str]] = field(default_factory=list)  # (vm name, nonce): for tests/admin

    def rotate(self, pki: SandboxPki) -> None:
        """Sign every later document with `pki` (the CA-change drill: sandbox/imds/ca_change.py)."""
        with self._lock:
            self.pki = pki
            self._cache.clear()

    def document(self, vm: str, identity: Identity, nonce: Optional[str],
                 now: Optional[float] = None) -> Dict[str, str]:
        if nonce is not None and not NONCE.fullmatch(nonce):
            raise BadNonce("nonce must be 1-32 ASCII letters or digits")
        now = time.time() if now is None else now
        with self._lock:
            cached = self._cache.get(vm)
            if cached is not None and now - cached[0] < self.cache_seconds:
                return cached[1]
        value = nonce if nonce is not None else time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        with self._lock:
            pki = self.pki
        signed = pki.sign(content(identity, value, now, self.lifetime))
        answer = {"encoding": "pkcs7", "signature": base64.b64encode(signed).decode("ascii")}
        with self._lock:
            self._cache[vm] = (now, answer)
            self.issued.append((vm, value))
            del self.issued[:-1000]
        return answer
