"""The simulator's /metadata/attested/document over real HTTP: Azure's response shape, the signed
fields, the nonce rules, and a chain that verifies only against this run's test root."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest
import requests
from asn1crypto import cms
from cryptography import x509

from sandbox import processes
from tests.forwarder.helpers import admin

URL = "/metadata/attested/document"
REST_SPEC_NONCE = "abcde12345"  # the IMDS REST spec's example nonce  # pragma: allowlist secret


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[processes.Server, Path]]:
    trust_dir = tmp_path_factory.mktemp("attestation")
    server = processes.start_imds(["--vm", "vm0", "--vm", "vm1", "--rate-limit", "0",
                                   "--attestation-dir", str(trust_dir)], log_dir=trust_dir)
    yield server, trust_dir / "trust.pem"
    server.stop()


def get(server: processes.Server, vm: str, **params: str) -> requests.Response:
    query = {"api-version": "2021-02-01", **params}
    return requests.get(f"http://{processes.LOOPBACK}:{server.port}/vms/{vm}{URL}", params=query,
                        headers={"Metadata": "true"}, timeout=10)


def signed(answer: Dict[str, Any]) -> Tuple[Dict[str, Any], Any]:
    der = base64.b64decode(answer["signature"], validate=True)
    data = cms.ContentInfo.load(der)["content"]
    return json.loads(data["encap_content_info"]["content"].native), data


def test_answer_has_azures_shape_and_fields(sim: Tuple[processes.Server, Path]) -> None:
    server, _ = sim
    resp = get(server, "vm0", nonce=REST_SPEC_NONCE)
    assert resp.status_code == 200
    answer = resp.json()
    assert set(answer) == {"encoding", "signature"} and answer["encoding"] == "pkcs7"
    content, data = signed(answer)
    vm0 = admin(server, "GET", "/vms/vm0")
    assert content["vmId"] == vm0["vmId"] and content["subscriptionId"] == vm0["subscriptionId"]
    assert content["nonce"] == REST_SPEC_NONCE
    assert set(content) >= {"nonce", "plan", "sku", "subscriptionId", "timeStamp", "vmId"}
    created = dt.datetime.strptime(content["timeStamp"]["createdOn"], "%m/%d/%y %H:%M:%S %z")
    expires = dt.datetime.strptime(content["timeStamp"]["expiresOn"], "%m/%d/%y %H:%M:%S %z")
    assert expires - created == dt.timedelta(hours=6)
    assert abs((created - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 60
    signer = data["signer_infos"][0]
    assert not signer["signed_attrs"].native  # as Azure's: the content itself is signed
    assert len(data["certificates"]) == 1  # the signer only; intermediates come from configuration


def test_each_vm_gets_its_own_vm_id(sim: Tuple[processes.Server, Path]) -> None:
    server, _ = sim
    ids = {signed(get(server, vm, nonce="1234567890").json())[0]["vmId"] for vm in ("vm0", "vm1")}
    assert len(ids) == 2


def test_signer_chains_to_the_written_root_only(sim: Tuple[processes.Server, Path]) -> None:
    server, trust_path = sim
    pem = trust_path.read_text()
    assert "PRIVATE KEY" not in pem  # only certificates leave the process
    root, intermediate = x509.load_pem_x509_certificates(pem.encode())
    _, data = signed(get(server, "vm0", nonce="x1").json())
    leaf = x509.load_der_x509_certificate(data["certificates"][0].chosen.dump())
    leaf.verify_directly_issued_by(intermediate)
    intermediate.verify_directly_issued_by(root)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "metadata.azure.com" in names.get_values_for_type(x509.DNSName)


@pytest.mark.parametrize("nonce", ["a" * 33, "abc-def", "nonce with space", "\u00e9t\u00e9"])
def test_a_nonce_outside_the_rest_spec_form_is_refused(sim: Tuple[processes.Server, Path],
                                                       nonce: str) -> None:
    resp = get(sim[0], "vm0", nonce=nonce)
    assert resp.status_code == 400 and "nonce" in resp.json()["error"]


def test_without_a_nonce_the_utc_time_stands_in(sim: Tuple[processes.Server, Path]) -> None:
    content, _ = signed(get(sim[0], "vm0").json())
    stamp = dt.datetime.strptime(content["nonce"], "%Y%m%d-%H%M%S").replace(tzinfo=dt.timezone.utc)
    assert abs((stamp - dt.datetime.now(dt.timezone.utc)).total_seconds()) < 60


def test_imds_rules_apply_to_the_route(sim: Tuple[processes.Server, Path]) -> None:
    server = sim[0]
    base = f"http://{processes.LOOPBACK}:{server.port}/vms/vm0{URL}"
    no_header = requests.get(base, params={"api-version": "2021-02-01"}, timeout=10)
    assert no_header.status_code == 400
    too_old = get(server, "vm0", **{"api-version": "2018-04-02"})
    assert too_old.status_code == 400 and "api-version" in too_old.json()["error"]
    post = requests.post(base, params={"api-version": "2021-02-01"}, headers={"Metadata": "true"}, timeout=10)
    assert post.status_code == 405


def test_cache_answers_an_older_nonce(tmp_path: Path) -> None:
    server = processes.start_imds(["--attestation-cache-seconds", "30"], log_dir=tmp_path)
    try:
        first = signed(get(server, "vm0", nonce="first1").json())[0]
        second = signed(get(server, "vm0", nonce="second2").json())[0]
    finally:
        server.stop()
    assert first["nonce"] == "first1" and second["nonce"] == "first1"


def test_a_move_changes_the_subscription_documents_name_and_a_refused_move_changes_nothing(
        sim: Tuple[processes.Server, Path]) -> None:
    """POST /admin/vms/<name>/move (Azure's resource move): compute metadata and attested documents name the
    new subscription; a move with one bad field is refused whole (a half-moved VM would have compute and
    documents disagree)."""
    server, _ = sim
    before = admin(server, "GET", "/vms/vm1")
    url = f"http://{processes.LOOPBACK}:{server.port}/admin/vms/vm1/move"
    sub = "99999999-0000-0000-0000-000000000000"
    refused = requests.post(url, json={"subscriptionId": sub, "resourceGroupName": ""}, timeout=10)
    assert refused.status_code == 400 and admin(server, "GET", "/vms/vm1") == before
    moved = admin(server, "POST", "/vms/vm1/move", {"subscriptionId": sub})
    assert moved["vmId"] == before["vmId"] and moved["subscriptionId"] == sub
    assert moved["resourceId"].startswith(f"/subscriptions/{sub}/resourceGroups/")
    content, _ = signed(get(server, "vm1", nonce=REST_SPEC_NONCE).json())
    assert content["subscriptionId"] == moved["subscriptionId"]
