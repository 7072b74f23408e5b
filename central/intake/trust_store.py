"""The deployment's trust for attested documents, with nothing for the operator to paste.

Roots: DigiCert Global Root G2 and Microsoft RSA Root Certificate Authority 2017, taken from certifi's
bundle, and nothing else of it. Why certifi and not the OS store: certifi is a pinned dependency
(constraints.txt), the same bytes in the Function app, in CI and on an operator's machine, kept by
its owners from Mozilla's root programme; the Functions host's OS store differs by image and is
updated by nobody we can name. Why only two of its roots: every Azure public-cloud and Azure
Government signer chains to one of them; trusting the whole Web PKI for a VM's identity would let
any public CA's mis-issued metadata.azure.com certificate speak for a VM.

Intermediates: the shipped Microsoft CAs in central/intake/trust/ (README.md there: which, from
where), so verification works offline; any other issuer is fetched through its AIA URL
(central.intake.aia), up to the levels the chain needs.

Operator PEM (AUTHN_TRUST_PEM, se-attest --roots): added to the above, never replacing it: its
self-signed certificates become roots, the others intermediates. 21Vianet needs DigiCert Global Root
CA (G1) that way; the sandbox hands its simulator's root that way.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from cryptography import x509
from cryptography.hazmat.primitives import hashes

from . import attested
from .chain import Fetch

_LABELLED = re.compile(r'^# Label: "([^"]*)"\n(?:#[^\n]*\n)*'
                       r"(-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----)", re.M | re.S)
SHIPPED_DIR = Path(__file__).parent / "trust"
CERTIFI_ROOTS: Tuple[str, ...] = ("DigiCert Global Root G2", "Microsoft RSA Root Certificate Authority 2017")


@functools.lru_cache(maxsize=1)
def shipped() -> Tuple[x509.Certificate, ...]:
    out: List[x509.Certificate] = []
    for path in sorted(SHIPPED_DIR.glob("*.pem")):
        out.extend(attested.read_pem(path.read_text(encoding="ascii"), str(path.name)))
    return tuple(out)


@functools.lru_cache(maxsize=1)
def certifi_roots() -> Tuple[x509.Certificate, ...]:
    import certifi

    text = Path(certifi.where()).read_text(encoding="ascii")
    # Only the two labelled blocks are parsed (every other root is none of our business).
    blocks = [m.group(2) for m in _LABELLED.finditer(text) if m.group(1) in CERTIFI_ROOTS]
    found = [c for c in attested.read_pem("".join(blocks), "certifi")
             if _cn(c) in CERTIFI_ROOTS and attested.self_signed(c)]
    if {_cn(c) for c in found} != set(CERTIFI_ROOTS):
        raise attested.TrustConfigError(f"certifi {certifi.__version__} lacks one of "
                                        f"{', '.join(CERTIFI_ROOTS)}: "
                                        "pin a certifi that has them (constraints.txt)")
    return tuple(found)


def _cn(cert: x509.Certificate) -> str:
    cns = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else ""


def default_trust(operator_pem: str = "", domains: Union[str, Sequence[str]] = attested.DEFAULT_DOMAINS,
                  fetch: Optional[Fetch] = None, skew_seconds: float = 300.0,
                  allow_digit_nonce: bool = False) -> attested.TrustConfig:
    """certifi's two roots + the shipped intermediates + the operator's PEM (may be empty) + AIA `fetch`
    (None: offline). Raises TrustConfigError on an unreadable PEM or an empty domain list."""
    operator = attested.read_pem(operator_pem, "AUTHN_TRUST_PEM") if operator_pem.strip() else []
    sources = {}
    for certs, source in ((certifi_roots(), "certifi"), (shipped(), "shipped"), (operator, "operator")):
        for cert in certs:
            sources.setdefault(cert.fingerprint(hashes.SHA256()), source)
    roots = (*certifi_roots(), *(c for c in operator if attested.self_signed(c)))
    intermediates = (*shipped(), *(c for c in operator if not attested.self_signed(c)))
    return attested.TrustConfig(roots, intermediates, attested.domain_list(domains), skew_seconds,
                                allow_digit_nonce, sources, fetch)


EXPIRY_WARNING_DAYS = 180  # health and se-attest warn this long before the trust's earliest expiry


def expiry(trust: attested.TrustConfig, now: datetime) -> Dict[str, Any]:
    """When the trust central verifies with starts to age out, as of `now` (pure): the earliest expiry of
    the certificates still valid (roots, shipped intermediates, AUTHN_TRUST_PEM's), a warning within
    EXPIRY_WARNING_DAYS of it, and those already expired (they can chain nothing: an operator's should be
    removed from AUTHN_TRUST_PEM)."""
    certs = [*trust.roots, *trust.intermediates]
    live = sorted((c for c in certs if c.not_valid_after_utc > now), key=lambda c: c.not_valid_after_utc)
    out: Dict[str, Any] = {"expired": [{"subject": _cn(c), "source": trust.source(c),
                                        "notAfter": utc_second(c.not_valid_after_utc)}
                                       for c in certs if c.not_valid_after_utc <= now]}
    if not live:
        return {**out, "earliest": None, "warning": "every certificate of the trust has expired"}
    first = live[0]
    days = int((first.not_valid_after_utc - now).total_seconds() // 86400)
    out.update({"earliest": utc_second(first.not_valid_after_utc), "subject": _cn(first),
                "source": trust.source(first), "daysLeft": days, "warning": None})
    if days < EXPIRY_WARNING_DAYS:
        fix = {"operator": "replace it in AUTHN_TRUST_PEM", "shipped": "upgrade central (a release ships its "
               "successor; until then the successor is fetched through AIA)"}.get(out["source"],
                                                                                  "upgrade certifi")
        out["warning"] = (f"{out['subject']} ({out['source']}) expires {out['earliest']}, in {days} days: "
                          f"{fix} (docs/security.md, 'When Azure changes its CA')")
    return out


def utc_second(when: datetime) -> str:
    """A certificate time as se-attest and health print it: UTC, to the second (2028-05-25T23:49:25Z)."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
