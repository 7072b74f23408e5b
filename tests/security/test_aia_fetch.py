"""AIA "CA Issuers" fetching, against a local HTTP server: an issuer the trust does not hold is
fetched, as many levels as the chain needs, only from allowlisted hosts, never from private or
link-local addresses, with a size cap, a timeout and a cache."""

from __future__ import annotations

import datetime as dt
import json
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, Iterator, Tuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import pkcs7

from central.intake import aia, attested
from sandbox.imds.attested import _issue
from tests.security import localhttp


def _pki(base: str) -> Dict[str, object]:
    """root -> bridge (no AIA needed: its issuer is the root) -> issuing CA (AIA: the bridge) -> leaf
    (AIA: the issuing CA): the shape of Azure's 2026 G2 chain, two levels to fetch."""
    now = dt.datetime.now(dt.timezone.utc)
    root = _issue("AIA Test Root", None, True, now, 30)
    bridge = _issue("AIA Test Bridge G2", root, True, now, 30)
    issuing = _issue("AIA Test Issuing CA 02", bridge, True, now, 30, aia=f"{base}/certs/bridge.crt")
    leaf = _issue("metadata.azure.com", issuing, False, now, 7, san=("eastus.metadata.azure.com",),
                  aia=f"{base}/certs/Issuing%20CA%2002.crt")
    content = json.dumps({"nonce": "n1", "vmId": "vm-aia", "subscriptionId": "s",
                          "timeStamp": {"createdOn": now.strftime("%m/%d/%y %H:%M:%S -0000"),
                                        "expiresOn": now.strftime("%m/%d/%y %H:%M:%S -0000")}}).encode()
    der = (pkcs7.PKCS7SignatureBuilder().set_data(content).add_signer(leaf.cert, leaf.key, hashes.SHA256())
           .sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.NoAttributes, pkcs7.PKCS7Options.Binary]))
    import base64

    return {"root": root.cert, "bridge": bridge.cert, "issuing": issuing.cert, "now": now,
            "doc": base64.b64encode(der).decode(), "issued": {"bridge": bridge, "issuing": issuing}}


@pytest.fixture
def served() -> Iterator[Tuple[object, Dict[str, object], Dict[str, bytes]]]:
    files: Dict[str, bytes] = {}

    def answer(handler: BaseHTTPRequestHandler) -> None:
        body = files.get(handler.path)
        if body is None:
            localhttp.reply(handler, 404)
        elif body.startswith(b"SLEEP"):
            time.sleep(1.5)
            localhttp.reply(handler, 200, b"")
        elif body.startswith(b"REDIRECT"):
            localhttp.reply(handler, 302, b"", {"Location": body[8:].decode()})
        else:
            localhttp.reply(handler, 200, body, {"Content-Type": "application/pkix-cert"})

    with localhttp.serve(answer) as server:
        pki = _pki(localhttp.url(server))
        files["/certs/bridge.crt"] = pki["bridge"].public_bytes(serialization.Encoding.DER)  # type: ignore
        files["/certs/Issuing%20CA%2002.crt"] = pki["issuing"].public_bytes(serialization.Encoding.DER)  # type: ignore
        yield server, pki, files


def _trust(pki: Dict[str, object], fetch: object) -> attested.TrustConfig:
    root_pem = pki["root"].public_bytes(serialization.Encoding.PEM).decode()  # type: ignore[attr-defined]
    base = attested.load_trust(root_pem, "metadata.azure.com")
    return attested.TrustConfig(base.roots, (), base.domains, fetch=fetch)  # type: ignore[arg-type]


Served = Tuple[object, Dict[str, object], Dict[str, bytes]]


def test_two_missing_levels_are_fetched_and_cached(served: Served) -> None:
    server, pki, _files = served
    fetcher = aia.AiaFetcher(hosts=["127.0.0.1"])
    found = attested.check_document(pki["doc"], _trust(pki, fetcher), pki["now"])  # type: ignore[arg-type]
    assert found.sources == ("document", "fetched", "fetched", "operator")
    assert sorted(server.seen) == ["GET /certs/Issuing%20CA%2002.crt", "GET /certs/bridge.crt"]  # type: ignore
    attested.check_document(pki["doc"], _trust(pki, fetcher), pki["now"])  # type: ignore[arg-type]
    assert len(server.seen) == 2 and fetcher.fetched == 2  # type: ignore[attr-defined]


def _expired_copy(cert: x509.Certificate, signer: Any, now: dt.datetime) -> x509.Certificate:
    """`cert` as its CA issued it a year before `now`, for 30 days: the same name and key, expired."""
    then = now - dt.timedelta(days=400)
    builder = (x509.CertificateBuilder().subject_name(cert.subject).issuer_name(cert.issuer)
               .public_key(cert.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(then).not_valid_after(then + dt.timedelta(days=30)))
    for ext in cert.extensions:
        builder = builder.add_extension(ext.value, ext.critical)
    return builder.sign(signer.key, hashes.SHA256())


def test_a_known_copy_that_cannot_issue_does_not_stop_the_fetch(served: Served) -> None:
    """Shipped intermediates expire (Azure's G2 bridge in 2029) and CAs are renewed under their own name: a
    known certificate of the issuer's name that has expired, or that holds another key, must not stop the
    AIA fetch of the one that signed (before, any certificate of that name did: every document failed)."""
    server, pki, _files = served
    issued = pki["issued"]  # type: ignore[index]
    now: dt.datetime = pki["now"]  # type: ignore[assignment]
    stale = {"expired": _expired_copy(issued["issuing"].cert, issued["bridge"], now),
             "another key": _issue("AIA Test Issuing CA 02", issued["bridge"], True, now, 30).cert}
    fetcher = aia.AiaFetcher(hosts=["127.0.0.1"])
    for what, copy in stale.items():
        base = _trust(pki, fetcher)
        trust = attested.TrustConfig(base.roots, (copy,), base.domains, fetch=fetcher,
                                     sources={copy.fingerprint(hashes.SHA256()): "shipped"})
        found = attested.check_document(pki["doc"], trust, now)  # type: ignore[arg-type]
        assert found.chain[1] == pki["issuing"] and found.sources[1] == "fetched", what
    assert "GET /certs/Issuing%20CA%2002.crt" in server.seen  # type: ignore[attr-defined]


def test_offline_or_not_allowlisted_is_a_trust_failure_naming_the_issuer(
        served: Tuple[object, Dict[str, object], Dict[str, bytes]]) -> None:
    server, pki, _files = served
    for fetch in (None, aia.AiaFetcher()):  # offline; the default allowlist (Microsoft/DigiCert hosts)
        with pytest.raises(attested.Fail) as failed:
            attested.check_document(pki["doc"], _trust(pki, fetch), pki["now"])  # type: ignore[arg-type]
        assert failed.value.kind == "trust" and failed.value.issuer == "AIA Test Issuing CA 02"
    assert server.seen == []  # type: ignore[attr-defined]


def test_a_second_level_that_cannot_be_fetched_names_that_issuer(
        served: Tuple[object, Dict[str, object], Dict[str, bytes]]) -> None:
    server, pki, files = served
    del files["/certs/bridge.crt"]
    fetcher = aia.AiaFetcher(hosts=["127.0.0.1"])
    with pytest.raises(attested.Fail) as failed:
        attested.check_document(pki["doc"], _trust(pki, fetcher), pki["now"])  # type: ignore[arg-type]
    assert failed.value.kind == "trust" and failed.value.issuer == "AIA Test Bridge G2"
    # the failure is cached: a burst of envelopes costs one attempt
    with pytest.raises(attested.Fail):
        attested.check_document(pki["doc"], _trust(pki, fetcher), pki["now"])  # type: ignore[arg-type]
    assert server.seen.count("GET /certs/bridge.crt") == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("address", ["169.254.169.254", "10.1.2.3", "192.168.0.7", "127.0.0.1", "fe80::1",
                                     "::1", "0.0.0.0"])
def test_an_allowlisted_name_resolving_to_a_private_address_is_never_fetched(address: str) -> None:
    fetcher = aia.AiaFetcher(resolve=lambda host, port: [address])
    with pytest.raises(aia.FetchError, match="private or link-local"):
        fetcher("http://www.microsoft.com/pkiops/certs/x.crt")
    assert fetcher.fetched == 0


def test_hosts_schemes_and_ip_literals_outside_the_allowlist_are_refused() -> None:
    fetcher = aia.AiaFetcher(resolve=lambda host, port: ["20.1.2.3"])
    for url in ("http://evil.example/x.crt", "https://www.microsoft.com/x.crt", "ftp://www.microsoft.com/x",
                "http://169.254.169.254/metadata/instance", "http://www.microsoft.com.evil.example/x.crt"):
        with pytest.raises(aia.FetchError):
            fetcher(url)
    assert fetcher.fetched == 0


def test_size_cap_timeout_and_redirects(served: Tuple[object, Dict[str, object], Dict[str, bytes]]) -> None:
    server, _pki, files = served
    base = localhttp.url(server)  # type: ignore[arg-type]
    files["/big.crt"] = b"0" * (aia.MAX_BYTES + 10)
    files["/slow.crt"] = b"SLEEP"
    files["/moved.crt"] = b"REDIRECT" + f"{base}/certs/bridge.crt".encode()
    fetcher = aia.AiaFetcher(hosts=["127.0.0.1"], timeout=0.5)
    with pytest.raises(aia.FetchError, match="over"):
        fetcher(f"{base}/big.crt")
    with pytest.raises(aia.FetchError, match=r"timeout|timed out"):
        fetcher(f"{base}/slow.crt")
    with pytest.raises(aia.FetchError, match="HTTP 302"):
        fetcher(f"{base}/moved.crt")
    assert "GET /certs/bridge.crt" not in server.seen  # type: ignore[attr-defined]
