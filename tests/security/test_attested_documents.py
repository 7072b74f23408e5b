"""Central's verifier against 18 genuine Azure attested documents (2019-2026, public cloud and US
Government, the old chains and the 2026 G2 chain) and 6 non-genuine ones, read in place from
../shared/reference/attested. Offline: no AIA fetching (fetch=None) and no operator PEM."""

from __future__ import annotations

import datetime as dt
from typing import List

import pytest

from central.intake import attested, chain, trust_store
from tests.security import attested_docs as docs

SECOND = dt.timedelta(seconds=1)


def defaults(**kw: object) -> attested.TrustConfig:
    return trust_store.default_trust(**kw)  # type: ignore[arg-type]


def dated(doc: docs.Doc, **kw: object) -> attested.TrustConfig:
    """The defaults, plus the retired intermediates (as AUTHN_TRUST_PEM) for a document of their time."""
    return defaults(operator_pem=docs.retired_pem() if docs.needs_retired(doc) else "", **kw)


def inside(doc: docs.Doc) -> List[dt.datetime]:
    """Times inside both the signer certificate's validity and the document's timeStamp window."""
    start = max(doc.created, doc.leaf.not_valid_before_utc)
    end = min(doc.expires, doc.leaf.not_valid_after_utc)
    assert start <= end, doc.name
    return [start, start + (end - start) / 2, end]


def test_the_reference_set_is_what_the_catalog_says() -> None:
    assert len(docs.trusted()) == 13
    assert docs.US_GOV in {d.name for d in docs.trusted()}


@pytest.mark.parametrize("doc", docs.trusted(), ids=lambda d: d.name)
def test_the_13_trusted_documents_verify_with_the_defaults(doc: docs.Doc) -> None:
    """Offline: every certificate the chain needs is shipped or in certifi, or, for a CA whose certificate
    expired and was retired from the shipped set, given by the operator as of the document's time."""
    trust = dated(doc)
    assert trust.fetch is None
    for when in inside(doc):
        found = attested.check_document(doc.signature, trust, when)
        assert found.claims["vmId"] == doc.claims["vmId"]
        assert found.chain[0] == doc.leaf
        assert found.sources[0] == "document" and found.sources[-1] == "certifi"
        assert set(found.sources[1:-1]) == ({"operator"} if docs.needs_retired(doc) else {"shipped"})
        assert chain.name_of(found.chain[-1].subject) in trust_store.CERTIFI_ROOTS


def test_documents_of_a_retired_ca_are_a_trust_failure_naming_it_without_its_certificate() -> None:
    """What central does today with a document whose CA expired and is no longer shipped: a trust failure
    that names the issuer (the AIA fetch would get it online), never a pass."""
    old = [d for d in docs.trusted() if docs.needs_retired(d)]
    assert len(old) == 4, [d.name for d in old]
    for doc in old:
        with pytest.raises(attested.Fail) as failed:
            attested.check_document(doc.signature, defaults(), doc.created)
        assert failed.value.kind == "trust" and failed.value.issuer in docs.RETIRED_ISSUERS


def test_the_retired_certificates_are_not_shipped_and_the_expiry_warns_180_days_ahead() -> None:
    """Issue 45, item 4, on any date: the shipped trust's earliest expiry is a dated fact of the files, and
    the warning is judged against a clock the test moves around it."""
    shipped = trust_store.shipped()
    assert not set(docs.RETIRED) & {p.name for p in trust_store.SHIPPED_DIR.glob("*.pem")}
    trust = defaults()
    first = min(c.not_valid_after_utc for c in shipped)
    assert first == dt.datetime(2028, 5, 25, 23, 49, 25, tzinfo=dt.timezone.utc)  # CA 03 by RSA Root 2017
    calm = trust_store.expiry(trust, first - dt.timedelta(days=200))
    assert calm["warning"] is None and calm["daysLeft"] == 200 and calm["expired"] == []
    assert calm["earliest"] == "2028-05-25T23:49:25Z" and calm["source"] == "shipped"
    near = trust_store.expiry(trust, first - dt.timedelta(days=100))
    assert near["daysLeft"] == 100 and "Microsoft Azure RSA TLS Issuing CA 03" in near["warning"]
    after = trust_store.expiry(trust, first + dt.timedelta(days=1))
    assert {"subject": "Microsoft Azure RSA TLS Issuing CA 03", "source": "shipped",
            "notAfter": "2028-05-25T23:49:25Z"} in after["expired"]
    assert after["earliest"] > "2028-05-25"
    operator = trust_store.expiry(defaults(operator_pem=docs.retired_pem()), first - dt.timedelta(days=200))
    assert len(operator["expired"]) == 6 and {c["source"] for c in operator["expired"]} == {"operator"}


def test_the_g2_documents_build_the_two_intermediate_chain() -> None:
    g2 = [d for d in docs.trusted() if "g2ocsp" in d.name]
    assert len(g2) == 2
    for doc in g2:
        found = attested.check_document(doc.signature, defaults(), doc.created)
        names = [chain.name_of(c.subject) for c in found.chain]
        assert names[1:] == ["Microsoft TLS G2 RSA CA OCSP 02", "Microsoft TLS RSA Root G2",
                             "DigiCert Global Root G2"]


@pytest.mark.parametrize("doc", docs.trusted(), ids=lambda d: d.name)
def test_a_document_is_refused_after_its_signer_expired(doc: docs.Doc) -> None:
    with pytest.raises(attested.Fail) as failed:
        attested.check_document(doc.signature, dated(doc), doc.leaf.not_valid_after_utc + SECOND)
    assert failed.value.kind == "time" and failed.value.reason == "expired"
    with pytest.raises(attested.Fail) as early:
        attested.check_document(doc.signature, dated(doc), doc.leaf.not_valid_before_utc - SECOND)
    assert early.value.kind == "time"


@pytest.mark.parametrize("doc", docs.trusted(), ids=lambda d: d.name)
def test_a_document_is_refused_when_only_another_clouds_domain_is_allowed(doc: docs.Doc) -> None:
    other = "metadata.azure.com" if doc.name == docs.US_GOV else "metadata.azure.us"
    with pytest.raises(attested.Fail) as failed:
        attested.check_document(doc.signature, dated(doc, domains=other), doc.created)
    assert failed.value.kind == "forgery" and failed.value.reason == "domain"
    own = "metadata.azure.us" if doc.name == docs.US_GOV else "metadata.azure.com"
    assert attested.check_document(doc.signature, dated(doc, domains=own), doc.created).claims  # control


@pytest.mark.parametrize("name", docs.BALTIMORE)
def test_baltimore_chains_are_a_trust_failure_naming_the_issuer(name: str) -> None:
    doc = docs.load(docs.DOCS / f"{name}.json")
    with pytest.raises(attested.Fail) as failed:
        attested.check_document(doc.signature, defaults(), doc.created)
    assert failed.value.kind == "trust"
    assert failed.value.issuer == chain.name_of(doc.leaf.issuer)
    assert failed.value.issuer.startswith("Microsoft")


@pytest.mark.parametrize("path", docs.negatives(), ids=lambda p: p.stem)
def test_the_6_non_genuine_documents_are_refused(path: object) -> None:
    import json

    signature = json.loads(path.read_text(encoding="utf-8"))["signature"]  # type: ignore[attr-defined]
    for when in (dt.datetime(2019, 12, 13, 1, tzinfo=dt.timezone.utc),
                 dt.datetime(2020, 12, 16, tzinfo=dt.timezone.utc),
                 dt.datetime(2026, 7, 28, 14, tzinfo=dt.timezone.utc)):
        with pytest.raises(attested.Fail) as failed:
            attested.check_document(signature, defaults(), when)
        assert failed.value.kind in ("malformed", "forgery", "time"), failed.value.detail
    # at the time the original was good, the altered ones fail as forgeries (or unreadable), not on time
    if path.stem.startswith("g2-"):  # type: ignore[attr-defined]
        with pytest.raises(attested.Fail) as failed:
            attested.check_document(signature, defaults(), dt.datetime(2026, 7, 28, 14, tzinfo=dt.UTC))
        assert failed.value.reason == "forged"


def test_the_reference_certificates_alone_accept_the_same_13() -> None:
    """Given the catalog's certificates (roots: the two certifi carries) and both clouds' domains."""
    roots_dir, inter_dir = docs.ATTESTED / "certs" / "roots", docs.ATTESTED / "certs" / "intermediates"
    pem = "".join(p.read_text() for p in (roots_dir / "digicert_global_root_g2.pem",
                                           roots_dir / "microsoft_rsa_root_ca_2017.pem"))
    pem += "".join(p.read_text() for p in sorted(inter_dir.glob("*.pem")))
    trust = attested.load_trust(pem, attested.DEFAULT_DOMAINS)
    accepted = []
    for doc in docs.genuine():
        try:
            attested.check_document(doc.signature, trust, doc.created)
            accepted.append(doc.name)
        except attested.Fail as fail:
            assert fail.kind == "trust", (doc.name, fail.detail)
    assert sorted(accepted) == sorted(d.name for d in docs.trusted())
