"""The simulator's CA-change drill over real HTTP (POST /admin/attestation/rotate): the signer moves to a
new intermediate under the same root; its AIA URL serves that intermediate, or answers 404; documents
issued before keep their chain."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
from asn1crypto import cms
from cryptography import x509
from cryptography.x509.oid import AuthorityInformationAccessOID, NameOID

from sandbox import processes


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[processes.Server]:
    server = processes.start_imds(["--vm", "vm0", "--rate-limit", "0"], log_dir=tmp_path)
    yield server
    server.stop()


def _http(server: processes.Server, method: str, path: str, **kw: Any) -> requests.Response:
    with requests.Session() as session:
        session.trust_env = False
        return session.request(method, f"http://{processes.LOOPBACK}:{server.port}{path}", timeout=10, **kw)


def _get(url: str) -> requests.Response:
    with requests.Session() as session:
        session.trust_env = False  # loopback: never through a proxy
        return session.get(url, timeout=10)


def _signer(server: processes.Server) -> x509.Certificate:
    answer = _http(server, "GET", "/metadata/attested/document?api-version=2021-02-01&nonce=abc123",
                   headers={"Metadata": "true"}).json()
    signed = cms.ContentInfo.load(base64.b64decode(answer["signature"]))["content"]
    return x509.load_der_x509_certificate(signed["certificates"][0].chosen.dump())


def _aia(cert: x509.Certificate) -> str:
    access = cert.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value
    return next(str(d.access_location.value) for d in access
                if d.access_method == AuthorityInformationAccessOID.CA_ISSUERS)


def _cn(name: x509.Name) -> str:
    return str(name.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_rotate_moves_the_signer_and_serves_the_new_intermediate_at_its_aia_url(
        sim: processes.Server) -> None:
    before = _signer(sim)
    assert _cn(before.issuer) == "se-sandbox Test TLS Issuing CA 01"
    moved = _http(sim, "POST", "/admin/attestation/rotate", json={"aia": "served"})
    assert moved.status_code == 201
    answer = moved.json()
    after = _signer(sim)
    assert _cn(after.issuer) == answer["issuer"] == "se-sandbox Test TLS Issuing CA 02"
    url = _aia(after)
    assert url == answer["aia"] and url.startswith(f"http://{processes.LOOPBACK}:{sim.port}/aia/")
    served = _get(url)
    assert served.status_code == 200 and served.headers["Content-Type"] == "application/pkix-cert"
    intermediate = x509.load_der_x509_certificate(served.content)
    after.verify_directly_issued_by(intermediate)  # raises if the served one did not sign the new signer
    root = x509.load_pem_x509_certificate(answer["rootPem"].encode())
    intermediate.verify_directly_issued_by(root)  # under the run's same root
    assert intermediate == x509.load_pem_x509_certificate(answer["intermediatePem"].encode())
    assert _http(sim, "GET", "/admin/attestation").json()["generation"] == 2


def test_an_unreachable_intermediate_is_published_nowhere_and_bad_requests_are_refused(
        sim: processes.Server) -> None:
    answer = _http(sim, "POST", "/admin/attestation/rotate", json={"aia": "unreachable"}).json()
    assert answer["reachable"] is False
    assert _get(_aia(_signer(sim))).status_code == 404
    assert _http(sim, "POST", "/admin/attestation/rotate", json={"aia": "sometimes"}).status_code == 400
    assert _http(sim, "POST", "/admin/attestation/rotate", data=b"{nope").status_code == 400
    assert _http(sim, "DELETE", "/admin/attestation").status_code == 404
