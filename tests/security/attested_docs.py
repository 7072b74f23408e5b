"""The real Azure attested documents of ../shared/reference/attested (CATALOG.md there): read in place,
never copied into the project. Shared by the tests that check central's verifier against them."""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from asn1crypto import cms
from cryptography import x509

ATTESTED = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "attested"
DOCS = ATTESTED / "docs"
# Chains to Baltimore CyberTrust Root (expired 2025-05-12, gone from certifi): not trusted today.
BALTIMORE = ("coder-2022-04-19-southcentralus-mrsatlsca01", "subman-2021-01-04-westeurope-mrsatlsca01",
             "tc-2019-12-13-westus-mitlsca4", "tc-2021-04-21-eastus-mrsatlsca02",
             "tc-2022-03-10-eastus-mrsatlsca01")
US_GOV = "coder-2023-03-08-usgovvirginia-aztlsca05"
# Intermediates central no longer ships because they expired (central/intake/trust/README.md, "Retired"):
# the documents they signed for are verified as of their own time with these given as AUTHN_TRUST_PEM.
RETIRED = ("microsoft_azure_tls_issuing_ca_01_xsign_by_digicert_global_root_g2.pem",
           "microsoft_azure_tls_issuing_ca_05_xsign_by_digicert_global_root_g2.pem",
           *(f"microsoft_azure_rsa_tls_issuing_ca_{n}_xsign_by_digicert_global_root_g2.pem"
             for n in ("03", "04", "07", "08")))
RETIRED_ISSUERS = ("Microsoft Azure TLS Issuing CA 01", "Microsoft Azure TLS Issuing CA 05")
FORMAT = "%m/%d/%y %H:%M:%S %z"


@dataclass(frozen=True)
class Doc:
    name: str
    signature: str      # the base64 PKCS#7, as IMDS answers it
    claims: Dict[str, Any]
    leaf: x509.Certificate

    @property
    def created(self) -> dt.datetime:
        return dt.datetime.strptime(self.claims["timeStamp"]["createdOn"], FORMAT)

    @property
    def expires(self) -> dt.datetime:
        return dt.datetime.strptime(self.claims["timeStamp"]["expiresOn"], FORMAT)


def load(path: Path) -> Doc:
    signature = json.loads(path.read_text(encoding="utf-8"))["signature"]
    signed = cms.ContentInfo.load(base64.b64decode(signature))["content"]
    leaf = x509.load_der_x509_certificate(signed["certificates"][0].chosen.dump())
    claims = json.loads(signed["encap_content_info"]["content"].native)
    return Doc(path.stem, signature, claims, leaf)


def genuine() -> List[Doc]:
    found = [load(p) for p in sorted(DOCS.glob("*.json"))]
    assert len(found) == 18, f"expected the 18 genuine documents in {DOCS} (CATALOG.md), found {len(found)}"
    return found


def trusted() -> List[Doc]:
    return [d for d in genuine() if d.name not in BALTIMORE]


def negatives() -> List[Path]:
    found = sorted((DOCS / "negative").glob("*.json"))
    assert len(found) == 6, f"expected the 6 non-genuine documents in {DOCS / 'negative'}, found {len(found)}"
    return found


def retired_pem() -> str:
    """The retired intermediates, read in place from the reference set (what an operator would paste)."""
    folder = ATTESTED / "certs" / "intermediates"
    return "".join((folder / name).read_text(encoding="ascii") for name in RETIRED)


def needs_retired(doc: Doc) -> bool:
    """A document whose signer was issued by a CA that only a retired certificate chains (no successor of
    that CA is shipped)."""
    issuer = doc.leaf.issuer.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    return issuer in RETIRED_ISSUERS
