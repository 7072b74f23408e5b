"""Build the attested document signer's certificate chain: known certificates first, AIA for the rest.

Pure apart from the `fetch` callable the caller may pass (central.intake.aia.AiaFetcher in central;
None = offline). Microsoft says not to pin intermediates and will not announce CA changes, and the
2026 move to the G2 hierarchy needs TWO intermediates the document does not carry (the issuing CA and
the cross-signed "Microsoft TLS RSA Root G2"), so the walk goes up as many AIA levels as the chain needs
(at most MAX_LEVELS), from the leaf and from every certificate it finds.

Every certificate carries its source (`shipped`, `operator`, `fetched`, `certifi`, `document`), so an
operator can see which one a chain used (se-attest). A chain that cannot be built raises ChainError
naming the issuer that could not be found, which is what the critical trust alert names.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.x509 import verification
from cryptography.x509.oid import AuthorityInformationAccessOID

MAX_LEVELS = 4          # leaf -> issuing CA -> bridge -> root: two fetched levels in 2026, room for one more
MAX_FETCHES = 8         # AIA URLs tried per chain: bounds the work a hostile certificate can ask for
MAX_CHAIN_DEPTH = 4

Fetch = Callable[[str], Sequence[x509.Certificate]]  # URL -> certificates (empty or raise on failure)
Sourced = Tuple[x509.Certificate, str]


class ChainError(Exception):
    """No chain to a trusted root. `issuer`: the name that could not be chained (its CN when it has one)."""

    def __init__(self, issuer: str, detail: str) -> None:
        super().__init__(detail)
        self.issuer = issuer
        self.detail = detail


@dataclass(frozen=True)
class Built:
    chain: Tuple[x509.Certificate, ...]  # leaf first, root last
    sources: Tuple[str, ...]             # one per certificate of `chain`


def name_of(name: x509.Name) -> str:
    cns = name.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(cns[0].value) if cns else name.rfc4514_string()


def ca_issuers(cert: x509.Certificate) -> List[str]:
    """The AIA "CA Issuers" URLs of a certificate (http(s) only)."""
    try:
        aia = cert.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    except x509.ExtensionNotFound:
        return []
    return [d.access_location.value for d in aia
            if d.access_method == AuthorityInformationAccessOID.CA_ISSUERS
            and isinstance(d.access_location, x509.UniformResourceIdentifier)
            and str(d.access_location.value).lower().startswith(("http://", "https://"))]


def build(leaf: x509.Certificate, host: str, now: dt.datetime, roots: Sequence[Sourced],
          pool: Sequence[Sourced], fetch: Optional[Fetch] = None) -> Built:
    """The Web PKI chain of `leaf` as a TLS server certificate for `host` (so its EKU must allow
    serverAuth: the 2026 G2 signers carry only that), at `now`, to one of `roots`."""
    known: Dict[bytes, Sourced] = {}
    for cert, source in [*roots, *pool]:
        known.setdefault(cert.fingerprint(hashes.SHA256()), (cert, source))
    root_names = {c.subject for c, _ in roots}
    missing = _walk(leaf, known, root_names, fetch, now)
    store = verification.Store([c for c, _ in roots])
    policy = (verification.PolicyBuilder().store(store).time(now.astimezone(dt.timezone.utc))
              .max_chain_depth(MAX_CHAIN_DEPTH))
    root_prints = {c.fingerprint(hashes.SHA256()) for c, _ in roots}
    intermediates = [c for fp, (c, _) in known.items() if fp not in root_prints]
    try:
        chain = policy.build_server_verifier(x509.DNSName(host)).verify(leaf, intermediates)
    except verification.VerificationError as exc:
        issuer = missing or name_of(leaf.issuer)
        raise ChainError(issuer, f"no chain from the signer to a trusted root through {issuer!r} ({exc})") \
            from None
    sources = tuple("document" if c == leaf else known.get(c.fingerprint(hashes.SHA256()), (c, "?"))[1]
                    for c in chain)
    return Built(tuple(chain), sources)


def can_issue(issuer: x509.Certificate, cert: x509.Certificate, now: dt.datetime) -> bool:
    """`issuer` is valid at `now` and its key verifies `cert`'s signature. A known certificate of the right
    name that cannot (an expired copy, a same-name renewal under another key: CAs are renewed under their
    name) must not stop the AIA fetch of the one that can."""
    at = now.astimezone(dt.timezone.utc)
    if not issuer.not_valid_before_utc <= at <= issuer.not_valid_after_utc:
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _walk(leaf: x509.Certificate, known: Dict[bytes, Sourced], root_names: set,
          fetch: Optional[Fetch], now: dt.datetime) -> str:
    """Fetch issuers that are not known (or known only in copies that cannot issue at `now`), level by
    level. Returns the CN of the first issuer that stays missing ("" when every issuer was found)."""
    frontier, missing, fetches = [leaf], "", 0
    for _level in range(MAX_LEVELS):
        nxt: List[x509.Certificate] = []
        for cert in frontier:
            if cert.issuer == cert.subject or cert.issuer in root_names:
                continue
            issuers = [c for c, _ in known.values()
                       if c.subject == cert.issuer and c is not cert and can_issue(c, cert, now)]
            if not issuers and fetch is not None:
                for url in ca_issuers(cert)[:2]:
                    if fetches >= MAX_FETCHES:
                        break
                    fetches += 1
                    try:
                        got = [c for c in fetch(url) if c.subject == cert.issuer]
                    except Exception:  # noqa: BLE001 - any fetch failure is "not found"; the chain decides
                        got = []
                    for c in got:
                        known.setdefault(c.fingerprint(hashes.SHA256()), (c, "fetched"))
                    got = [c for c in got if can_issue(c, cert, now)]
                    if got:
                        issuers = got
                        break
            if not issuers:
                missing = missing or name_of(cert.issuer)
            nxt.extend(issuers)
        if not nxt:
            break
        frontier = nxt
    return missing

