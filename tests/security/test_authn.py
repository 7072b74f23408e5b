"""central/intake/authn.py on genuine material (made by the forwarder's Attestor from the IMDS simulator over
HTTP) and on every forgery a VM of the fleet (or anyone with send rights on the hub) can build."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest
from asn1crypto import cms, core
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from central.intake import authn
from forwarder.attestation import Attestor
from forwarder.imds import ImdsClient
from sandbox import processes
from sandbox.imds.attested import AttestedDocuments, SandboxPki
from sandbox.imds.identity import Identity
from schemas import authn as wire
from tests.forwarder.helpers import admin, imds_url

NOW = dt.datetime.now(dt.timezone.utc)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """The simulator with vm0 (the victim) and vm1 (the attacker's VM), an Attestor on each."""
    trust_dir = tmp_path_factory.mktemp("authn")
    server = processes.start_imds(["--vm", "vm0", "--vm", "vm1", "--attestation-dir", str(trust_dir)],
                                  log_dir=trust_dir)
    attestors = {vm: Attestor(ImdsClient(imds_url(server, vm))) for vm in ("vm0", "vm1")}
    for attestor in attestors.values():
        attestor.begin()
    found = {vm: admin(server, "GET", f"/vms/{vm}") for vm in attestors}
    ids = {vm: doc["vmId"] for vm, doc in found.items()}
    yield {"server": server, "trust": authn.load_trust((trust_dir / "trust.pem").read_text()),
           "attestors": attestors, "ids": ids,
           "subscriptions": {vm: doc["subscriptionId"] for vm, doc in found.items()}}
    for attestor in attestors.values():
        attestor.client.close()
    server.stop()


def body_for(vm_id: str, text: str = "hello") -> bytes:
    return json.dumps({"partitionkey": vm_id, "data": {"vm": {"vmId": vm_id}, "text": text}}).encode()


def signed_by(fleet: Dict[str, Any], vm: str, body: bytes) -> Dict[str, str]:
    attestor = fleet["attestors"][vm]
    attestor.begin()  # the next event carries the document
    return attestor.sign(body)


def check(fleet: Dict[str, Any], body: bytes, props: Dict[str, str], claimed: str,
          now: dt.datetime = NOW, **kw: Any) -> authn.Result:
    return authn.verify(body, props, kw.pop("trust", fleet["trust"]), now, claimed, **kw)


def new_key() -> Tuple[ed25519.Ed25519PrivateKey, bytes]:
    key = ed25519.Ed25519PrivateKey.generate()
    return key, key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def material(key: ed25519.Ed25519PrivateKey, pub: bytes, att: str, body: bytes,
             kid: str = "") -> Dict[str, str]:
    return {wire.PROP_VERSION: "1", wire.PROP_KID: kid or wire.nonce_for(pub),
            wire.PROP_SIGNATURE: wire.b64url(key.sign(wire.SIGNING_PREFIX + body)),
            wire.PROP_PUBLIC_KEY: wire.b64url(pub), wire.PROP_ATTESTATION: att}


# ---- genuine ---------------------------------------------------------------------------------------

def test_genuine_envelope_names_its_vm(fleet: Dict[str, Any]) -> None:
    vm0 = fleet["ids"]["vm0"]
    body = body_for(vm0)
    result = check(fleet, body, signed_by(fleet, "vm0", body), vm0)
    assert isinstance(result, authn.Authenticated) and result.vm_id == vm0
    assert result.key.kid == fleet["attestors"]["vm0"].kid


def test_later_events_verify_with_the_stored_key_only(fleet: Dict[str, Any]) -> None:
    """attach_every > 0: the document rides on a send's first event; the rest carry ~200 bytes."""
    vm0 = fleet["ids"]["vm0"]
    attestor = Attestor(fleet["attestors"]["vm0"].client, attach_every=3600)
    attestor.begin()
    first, later = body_for(vm0, "first"), body_for(vm0, "later")
    key = check(fleet, first, attestor.sign(first), vm0)
    assert isinstance(key, authn.Authenticated)
    props = attestor.sign(later)
    assert wire.PROP_ATTESTATION not in props and len(json.dumps(props)) < 200
    assert check(fleet, later, props, vm0, known=key.key).ok
    unknown = check(fleet, later, props, vm0)
    assert isinstance(unknown, authn.Rejected) and unknown.reason == "unknown-key"


def test_cache_gives_the_same_answers(fleet: Dict[str, Any]) -> None:
    vm0, cache = fleet["ids"]["vm0"], {}
    body = body_for(vm0)
    props = signed_by(fleet, "vm0", body)
    assert check(fleet, body, props, vm0, cache=cache).ok and len(cache) == 1
    assert check(fleet, body, props, vm0, cache=cache).ok
    late = NOW + dt.timedelta(hours=7)
    assert check(fleet, body, props, vm0, now=late, cache=cache).reason == "expired"  # type: ignore[union-attr]


# ---- forgeries -------------------------------------------------------------------------------------

def rejected(result: authn.Result, reason: str) -> None:
    assert isinstance(result, authn.Rejected), result
    assert result.reason == reason, result
    assert result.detail


def test_another_vms_attested_key_cannot_speak_for_the_victim(fleet: Dict[str, Any]) -> None:
    """vm1 signs, with its own genuine document, an envelope that claims to be vm0."""
    vm0 = fleet["ids"]["vm0"]
    body = body_for(vm0)
    rejected(check(fleet, body, signed_by(fleet, "vm1", body), vm0), "vmid")


def test_a_vms_own_key_cannot_speak_for_a_case_variant_of_its_vmid(fleet: Dict[str, Any]) -> None:
    """Central keys VM rows, name bindings and sender checks on the vmId as written: an upper-case variant
    of a VM's own id would be a second identity (bound to another VM's name) that its genuine key signs."""
    vm0 = fleet["ids"]["vm0"]
    for variant in (vm0.upper(), vm0[:8].upper() + vm0[8:]):
        assert variant != vm0
        body = body_for(variant)
        rejected(check(fleet, body, signed_by(fleet, "vm0", body), variant), "vmid")


def test_a_vm_cannot_claim_a_subscription_its_document_does_not_name(fleet: Dict[str, Any]) -> None:
    """The policy matches on the subscription in vm.resourceId and the ARM path acknowledges under it: a VM
    that could choose it could match another subscription's rules, or point an ARM acknowledge there."""
    vm0, own = fleet["ids"]["vm0"], fleet["subscriptions"]["vm0"]
    other = "11111111-2222-3333-4444-555555555555"
    assert other != own
    body = body_for(vm0)
    props = signed_by(fleet, "vm0", body)
    rejected(check(fleet, body, props, vm0, claimed_subscriptions=[own, other]), "subscription")
    rejected(check(fleet, body, props, vm0, claimed_subscriptions=[other]), "subscription")
    assert check(fleet, body, props, vm0, claimed_subscriptions=[own.upper()]).ok  # ARM ignores case
    assert check(fleet, body, props, vm0, claimed_subscriptions=[]).ok  # an envelope that names none


def test_a_copied_document_with_the_attackers_key_fails_the_nonce(fleet: Dict[str, Any]) -> None:
    vm0 = fleet["ids"]["vm0"]
    body = body_for(vm0, "forged")
    genuine = signed_by(fleet, "vm0", body_for(vm0))
    key, pub = new_key()
    rejected(check(fleet, body, material(key, pub, genuine[wire.PROP_ATTESTATION], body), vm0), "nonce")
    # the same with the victim's key id claimed
    props = material(key, pub, genuine[wire.PROP_ATTESTATION], body, kid=genuine[wire.PROP_KID])
    rejected(check(fleet, body, props, vm0), "nonce")


def test_a_copied_document_and_public_key_without_the_private_key(fleet: Dict[str, Any]) -> None:
    vm0 = fleet["ids"]["vm0"]
    genuine = signed_by(fleet, "vm0", body_for(vm0))
    body = body_for(vm0, "forged")
    key, _ = new_key()
    props = dict(genuine, **{wire.PROP_SIGNATURE: wire.b64url(key.sign(wire.SIGNING_PREFIX + body))})
    rejected(check(fleet, body, props, vm0), "signature")


def test_expired_and_future_documents(fleet: Dict[str, Any]) -> None:
    vm0 = fleet["ids"]["vm0"]
    body = body_for(vm0)
    props = signed_by(fleet, "vm0", body)
    rejected(check(fleet, body, props, vm0, now=NOW + dt.timedelta(hours=6, minutes=10)), "expired")
    rejected(check(fleet, body, props, vm0, now=NOW - dt.timedelta(minutes=30)), "not-yet-valid")
    assert check(fleet, body, props, vm0, now=NOW + dt.timedelta(hours=5, minutes=50)).ok


def test_a_document_from_another_root_is_untrusted(fleet: Dict[str, Any]) -> None:
    """The attacker runs its own PKI with a metadata.azure.com certificate and signs vm0's vmId."""
    vm0 = fleet["ids"]["vm0"]
    key, pub = new_key()
    attacker_pki = AttestedDocuments(SandboxPki.generate())
    forged = attacker_pki.document("vm0", Identity("vm0", vmId=vm0), wire.nonce_for(pub))
    body = body_for(vm0)
    rejected(check(fleet, body, material(key, pub, forged["signature"], body), vm0), "untrusted")


def test_a_trusted_chain_for_a_name_outside_the_metadata_domains(fleet: Dict[str, Any]) -> None:
    pki = SandboxPki.generate(domain="example.com")
    vm0 = fleet["ids"]["vm0"]
    key, pub = new_key()
    doc = AttestedDocuments(pki).document("vm0", Identity("vm0", vmId=vm0), wire.nonce_for(pub))
    body = body_for(vm0)
    props = material(key, pub, doc["signature"], body)
    rejected(check(fleet, body, props, vm0, trust=authn.load_trust(pki.trust_pem())), "domain")
    allowed = authn.load_trust(pki.trust_pem(), domains="example.com")
    assert check(fleet, body, props, vm0, trust=allowed).ok  # control: the same material, domain allowed


def test_a_tampered_body_fails_the_signature(fleet: Dict[str, Any]) -> None:
    vm0 = fleet["ids"]["vm0"]
    body = body_for(vm0, "approved")
    props = signed_by(fleet, "vm0", body)
    rejected(check(fleet, body.replace(b"approved", b"rejected"), props, vm0), "signature")
    rejected(check(fleet, body + b" ", props, vm0), "signature")


def test_a_vm_id_mismatch(fleet: Dict[str, Any]) -> None:
    vm1 = fleet["ids"]["vm1"]
    body = body_for(vm1)  # the body claims vm1, signed by vm0's key
    rejected(check(fleet, body, signed_by(fleet, "vm0", body), vm1), "vmid")


def test_an_altered_document_content_breaks_azures_signature(fleet: Dict[str, Any]) -> None:
    vm0, vm1 = fleet["ids"]["vm0"], fleet["ids"]["vm1"]
    props = signed_by(fleet, "vm1", body_for(vm1))
    der = base64.b64decode(props[wire.PROP_ATTESTATION])
    info = cms.ContentInfo.load(der)
    content = info["content"]["encap_content_info"]["content"].native
    info["content"]["encap_content_info"]["content"] = core.OctetString(
        content.replace(vm1.encode(), vm0.encode()))
    altered = base64.b64encode(info.dump(force=True)).decode()
    body = body_for(vm0)
    attestor_key = fleet["attestors"]["vm1"]._key
    forged = material(attestor_key, attestor_key.public, altered, body)
    rejected(check(fleet, body, forged, vm0), "forged")


@pytest.mark.parametrize("props, reason", [
    ({}, "missing"),
    ({wire.PROP_VERSION: "2"}, "missing"),
    ({wire.PROP_VERSION: "1", wire.PROP_KID: "k", wire.PROP_SIGNATURE: "!!"}, "malformed"),
    ({wire.PROP_VERSION: "1", wire.PROP_KID: "k", wire.PROP_SIGNATURE: wire.b64url(b"x" * 64),
      wire.PROP_PUBLIC_KEY: wire.b64url(b"p" * 32), wire.PROP_ATTESTATION: "not base64 at all"}, "malformed"),
    ({wire.PROP_VERSION: "1", wire.PROP_KID: "k", wire.PROP_SIGNATURE: wire.b64url(b"x" * 64),
      wire.PROP_PUBLIC_KEY: wire.b64url(b"p" * 32), wire.PROP_ATTESTATION: "QUJD" * 5000}, "malformed"),
    ({wire.PROP_VERSION: "1", wire.PROP_KID: "k", wire.PROP_SIGNATURE: wire.b64url(b"x" * 64),
      wire.PROP_PUBLIC_KEY: wire.b64url(b"p" * 32), wire.PROP_ATTESTATION: "MAA="}, "malformed"),
])
def test_missing_or_hostile_material_is_rejected_with_a_reason(fleet: Dict[str, Any], props: Dict[str, str],
                                                               reason: str) -> None:
    vm0 = fleet["ids"]["vm0"]
    rejected(check(fleet, body_for(vm0), props, vm0), reason)


def test_the_ten_digit_nonce_only_when_allowed(fleet: Dict[str, Any]) -> None:
    server = fleet["server"]
    vm0 = fleet["ids"]["vm0"]
    key, pub = new_key()
    client = ImdsClient(imds_url(server, "vm0"))
    try:
        answer = client.request("GET", f"/metadata/attested/document?nonce={wire.digit_nonce_for(pub)}",
                                "2021-02-01").json()
    finally:
        client.close()
    body = body_for(vm0)
    props = material(key, pub, answer["signature"], body, kid=wire.digit_nonce_for(pub))
    rejected(check(fleet, body, props, vm0), "nonce")
    lenient = authn.TrustConfig(fleet["trust"].roots, fleet["trust"].intermediates, allow_digit_nonce=True)
    assert check(fleet, body, props, vm0, trust=lenient).ok


def test_trust_setting_errors_say_what_to_fix(fleet: Dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(authn.TrustConfigError, match="no PEM certificate"):
        authn.load_trust("")
    only_intermediate = fleet["trust"].intermediates[0].public_bytes(serialization.Encoding.PEM).decode()
    with pytest.raises(authn.TrustConfigError, match="no self-signed root"):
        authn.load_trust(only_intermediate)
    flattened = fleet["trust"].roots[0].public_bytes(serialization.Encoding.PEM).decode().replace("\n", " ")
    assert len(authn.load_trust(flattened).roots) == 1  # an app setting may flatten newlines
