"""The CA-change drill (issue 22, point 2): move the attested-document signer to a new intermediate mid-run,
as Azure did in 2026 without notice, and serve (or not) that intermediate at the signer's AIA URL.

    POST /admin/attestation/rotate   {"aia": "served" | "unreachable"}   (default "served")
    GET  /admin/attestation          the current chain: issuer, AIA URL, the PEMs
    GET  /aia/<file>.crt             a served intermediate (DER), as a CA's "CA Issuers" host answers

Each rotation makes "se-sandbox Test TLS Issuing CA NN" (02, 03, ...) under the run's same test root and a
new signer certificate under it whose AIA "CA Issuers" URL points at this simulator's /aia/ route:
- served: the intermediate is there (a verifier that may fetch from this loopback address chains it);
- unreachable: the URL answers 404 (nothing is published anywhere: only an operator-supplied copy helps).
Documents issued before the move keep their old chain (they verify as before); new ones use the new
chain. The answer carries the new intermediate's PEM (public), which is what the operator supplies in the
unreachable case (central's AUTHN_TRUST_PEM). Central fetches AIA only from hosts on AUTHN_AIA_HOSTS and
never from a loopback address unless that literal address is listed there, so a drill's central names
127.0.0.1 explicitly (production defaults are untouched).
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any, Dict

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from .attested import AttestedDocuments, SandboxPki, _issue
from .responses import Response, error, json_response

MODES = ("served", "unreachable")


class CaChange:
    """The admin call and the /aia/ route over one simulator's AttestedDocuments."""

    def __init__(self, attested: AttestedDocuments) -> None:
        self.attested = attested
        self.served: Dict[str, bytes] = {}  # /aia/<file> -> DER
        self.aia = ""
        self.reachable = True
        self.generation = 1
        self._lock = threading.Lock()

    def handle(self, method: str, parts: list, payload: Any, base_url: str) -> Response:
        """`parts`: the path after /admin/attestation; `base_url`: this simulator's http://host:port."""
        if method == "GET" and not parts:
            return json_response(200, self.describe())
        if method == "POST" and parts == ["rotate"]:
            mode = (payload or {}).get("aia", "served") if isinstance(payload, dict) else None
            if mode not in MODES:
                return error(400, f'"aia" must be one of {", ".join(MODES)}')
            return json_response(201, self.rotate(mode == "served", base_url))
        return error(404, "no such admin route (POST /admin/attestation/rotate, GET /admin/attestation)")

    def rotate(self, reachable: bool, base_url: str) -> Dict[str, Any]:
        with self._lock:
            self.generation += 1
            old = self.attested.pki
            now = dt.datetime.now(dt.timezone.utc)
            days = max(1, (old.leaf.cert.not_valid_after_utc - now).days)
            name = f"se-sandbox Test TLS Issuing CA {self.generation:02d}"
            intermediate = _issue(name, old.root, True, now, days=days + 23)
            path = f"/aia/issuing-ca-{self.generation:02d}.crt" if reachable \
                else f"/aia/unpublished-ca-{self.generation:02d}.crt"
            self.aia = base_url.rstrip("/") + path
            sans = old.leaf.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            names = tuple(sans.get_values_for_type(x509.DNSName))
            subject = old.leaf.cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
            leaf = _issue(str(subject), intermediate, False, now, days=days, san=names, aia=self.aia)
            if reachable:
                self.served[path] = intermediate.cert.public_bytes(serialization.Encoding.DER)
            self.reachable = reachable
            self.attested.rotate(SandboxPki(old.root, intermediate, leaf))
            return self.describe()

    def describe(self) -> Dict[str, Any]:
        pki = self.attested.pki

        def pem(cert: x509.Certificate) -> str:
            return cert.public_bytes(serialization.Encoding.PEM).decode("ascii")

        issuer = pki.intermediate.cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
        return {"issuer": str(issuer), "aia": self.aia or None, "reachable": self.reachable,
                "generation": self.generation, "intermediatePem": pem(pki.intermediate.cert),
                "rootPem": pem(pki.root.cert)}

    def certificate(self, path: str) -> Response:
        der = self.served.get(path)
        if der is None:
            return error(404, "Not found (this intermediate is published nowhere)")
        return Response(200, der, {"Content-Type": "application/pkix-cert"})
