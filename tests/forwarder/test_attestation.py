"""forwarder/attestation.py against the IMDS simulator over HTTP: fetching the attested document for the
key's nonce, signing, refreshing before expiry, IMDS's cache and outages, and the request budget."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from central.intake import authn
from forwarder.attestation import AttestationError, Attestor
from forwarder.imds import ImdsClient
from sandbox import processes
from schemas import authn as wire
from tests.forwarder.helpers import admin, imds_url


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def imds(tmp_path: Path) -> Iterator[processes.Server]:
    server = processes.start_imds(["--attestation-dir", str(tmp_path), "--attestation-lifetime", "600"],
                                  log_dir=tmp_path)
    yield server
    server.stop()


def attested_requests(server: processes.Server) -> List[dict]:
    return [r for r in admin(server, "GET", "/requests?vm=vm0") if r["path"] == "/metadata/attested/document"]


def verify(server: processes.Server, tmp_path: Path, body: bytes, props: dict, at: float) -> authn.Result:
    trust = authn.load_trust((tmp_path / "trust.pem").read_text())
    vm_id = admin(server, "GET", "/vms/vm0")["vmId"]
    return authn.verify(body, props, trust, dt.datetime.fromtimestamp(at, dt.timezone.utc), vm_id)


def test_fetches_the_document_for_its_key_and_signs_what_central_accepts(imds: processes.Server,
                                                                       tmp_path: Path) -> None:
    client = ImdsClient(imds_url(imds))
    attestor = Attestor(client)
    try:
        attestor.begin()
        body = b'{"any":"bytes"}'
        props = attestor.sign(body)
    finally:
        client.close()
    asked = attested_requests(imds)
    assert len(asked) == 1 and asked[0]["query"]["nonce"] == attestor.kid == props[wire.PROP_KID]
    assert asked[0]["headers"].get("Metadata") == "true"
    assert len(attestor.kid or "") == 32 and (attestor.kid or "").isalnum()
    result = verify(imds, tmp_path, body, props, time.time())
    assert isinstance(result, authn.Authenticated), result


def test_refreshes_with_a_new_key_halfway_and_not_before(imds: processes.Server, tmp_path: Path) -> None:
    clock = Clock()
    client = ImdsClient(imds_url(imds))
    attestor = Attestor(client, clock=clock)
    try:
        attestor.begin()
        first = attestor.kid
        for _ in range(20):  # every send calls begin(): no IMDS request while the document is fresh
            attestor.begin()
        assert len(attested_requests(imds)) == 1 and attestor.kid == first
        clock.now += 300 + 1  # half of the 600 s lifetime
        attestor.begin()
        assert attestor.kid != first and len(attested_requests(imds)) == 2
        body = b"x"
        assert verify(imds, tmp_path, body, attestor.sign(body), time.time()).ok
    finally:
        client.close()


def test_an_outage_keeps_the_old_key_until_its_document_nears_expiry(imds: processes.Server) -> None:
    clock = Clock()
    client = ImdsClient(imds_url(imds), retry_seconds=0.5)
    attestor = Attestor(client, clock=clock)
    try:
        attestor.begin()
        kid = attestor.kid
        admin(imds, "POST", "/faults", {"kind": "status", "status": 500, "path": "attested", "count": 1000})
        clock.now += 400  # refresh due, IMDS failing: the old key still signs
        attestor.begin()
        assert attestor.kid == kid
        requests_during_backoff = len(attested_requests(imds))
        attestor.begin()  # inside the retry backoff: IMDS is not asked again
        assert len(attested_requests(imds)) == requests_during_backoff
        clock.now += 200  # 600 s: the document expired; nothing is signed unauthenticated
        with pytest.raises(AttestationError, match="no current attested document"):
            attestor.begin()
    finally:
        client.close()


def test_a_cached_document_for_another_nonce_is_not_used(tmp_path: Path) -> None:
    server = processes.start_imds(["--attestation-cache-seconds", "1.5"], log_dir=tmp_path)
    clock = Clock()
    clients = [ImdsClient(imds_url(server)) for _ in range(2)]
    try:
        Attestor(clients[0]).begin()  # IMDS now caches that document
        second = Attestor(clients[1], clock=clock)
        with pytest.raises(AttestationError, match="no current attested document"):
            second.begin()
        time.sleep(1.6)
        clock.now += 120
        second.begin()
        assert second.kid and second.kid in [r["query"].get("nonce") for r in attested_requests(server)]
    finally:
        for client in clients:
            client.close()
        server.stop()


def test_a_move_to_another_subscription_renews_the_document_at_once(imds: processes.Server,
                                                                   tmp_path: Path) -> None:
    """Central holds a signed envelope's resourceId to the subscription the attested document names. After
    Azure moves the VM, the forwarder's envelopes name the new subscription: the first send renews the
    document (at most once a minute while IMDS still names the old one), instead of half a document's life
    of refused envelopes."""
    from forwarder.sinks.eventhub import claimed_subscription

    clock = Clock()
    client = ImdsClient(imds_url(imds))
    attestor = Attestor(client, clock=clock)
    try:
        old = admin(imds, "GET", "/vms/vm0")["subscriptionId"]
        attestor.begin(old)
        first = attestor.kid
        attestor.begin(old)
        assert attestor.kid == first and len(attested_requests(imds)) == 1
        moved_to = "11111111-2222-3333-4444-555555555555"
        identity = admin(imds, "POST", "/vms/vm0/move", {"subscriptionId": moved_to})
        envelope = {"data": {"vm": {"vmId": identity["vmId"], "resourceId": identity["resourceId"]}}}
        new = claimed_subscription([envelope])
        assert new == moved_to and old not in identity["resourceId"]
        attestor.begin(new)
        assert attestor.kid != first and len(attested_requests(imds)) == 2
        body = b'{"moved":true}'
        result = verify(imds, tmp_path, body, attestor.sign(body), clock.now)
        assert result.ok and result.key.subscription_id == new  # type: ignore[union-attr]
        attestor.begin(new)
        attestor.begin(old)  # an older envelope: not renewed again within the minute
        assert len(attested_requests(imds)) == 2
    finally:
        client.close()


# ---- expiresOn, read on the VM without strptime ------------------------------------------------------

# The signed content of a real Azure document (shared reference, attested/CATALOG.md), as it sits in the DER.
REAL_SIGNED = (b'{"licenseType":"","nonce":"20220419-072721","plan":{"name":"","product":"","publisher":""},'
               b'"sku":"20_04-lts-gen2","subscriptionId":"5f130ffc-0a3e-4795-b691-4f56a12a5547","timeStamp":'
               b'{"createdOn":"04/19/22 01:27:21 -0000","expiresOn":"04/19/22 07:27:21 -0000"}}')


@pytest.mark.parametrize("stamp", ["04/19/22 07:27:21 -0000", "12/31/29 23:59:59 +0130",
                                   "02/29/28 00:00:00 -0800"])
def test_expires_on_reads_as_strptime_reads_it(stamp: str) -> None:
    from forwarder.attestation import _lifetime

    expected = dt.datetime.strptime(stamp, "%m/%d/%y %H:%M:%S %z").timestamp()
    der = b"\x30\x82junk" + REAL_SIGNED.replace(b"04/19/22 07:27:21 -0000", stamp.encode()) + b"\x00tail"
    assert _lifetime(der, expected - 1234.0) == 1234.0
    assert _lifetime(der, expected + 5.0) == 0.0  # expired: nothing left, never negative


@pytest.mark.parametrize("stamp", ["13/19/22 07:27:21 -0000", "02/30/23 00:00:00 +0000",
                                   "2022-04-19T07:27:21Z"])
def test_an_unreadable_expires_on_plans_with_the_default_lifetime(stamp: str) -> None:
    from forwarder.attestation import LIFETIME_IF_UNREADABLE, _lifetime

    der = REAL_SIGNED.replace(b"04/19/22 07:27:21 -0000", stamp.encode())
    assert _lifetime(der, 0.0) == LIFETIME_IF_UNREADABLE


def test_reading_expires_on_does_not_load_strptime() -> None:
    import subprocess
    import sys

    probe = (f"import sys; from forwarder.attestation import _lifetime; _lifetime({REAL_SIGNED!r}, 0.0); "
             "print('_strptime' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          cwd=processes.REPO, check=True)
    assert done.stdout.strip() == "False"
