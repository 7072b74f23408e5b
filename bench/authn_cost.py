"""Cost of sender authentication per envelope: bytes added to each Event Hubs event, the forwarder's
signing time, and central's verification time (a document seen first, a document already verified by
this instance, a key known from the store). In process, with the IMDS simulator's test PKI (RSA-2048
signer like Azure's); 3 runs, median and range.

    python -m bench.authn_cost
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
import time
from typing import Callable, List

from bench import Figure, record
from central.intake import authn
from forwarder.attestation import Attestor
from sandbox.imds.attested import AttestedDocuments, SandboxPki
from sandbox.imds.identity import from_spec

RUNS = 3
ENVELOPE_BYTES = 2048  # a typical incarnation envelope


class _DocumentsClient:
    """The Attestor's IMDS client, answered in process by the simulator's own document maker."""

    def __init__(self, documents: AttestedDocuments, vm: str) -> None:
        self.documents, self.identity = documents, from_spec({"name": vm})

    def request(self, method: str, path: str, api_version: str) -> object:
        nonce = path.split("nonce=", 1)[1]
        text = json.dumps(self.documents.document(self.identity.name, self.identity, nonce))
        return type("Answer", (), {"text": text})()


def per_call_us(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def runs(fn: Callable[[], object], n: int) -> List[float]:
    return [per_call_us(fn, n) for _ in range(RUNS)]


def show(name: str, values: List[float], unit: str) -> float:
    median = statistics.median(values)
    print(f"{name}: median {median:.1f} {unit} (range {min(values):.1f}-{max(values):.1f}, {RUNS} runs)")
    return median


def main(argv: List[str]) -> int:
    documents = AttestedDocuments(SandboxPki.generate())
    trust = authn.load_trust(documents.pki.trust_pem())
    full = Attestor(_DocumentsClient(documents, "vm0"))  # type: ignore[arg-type]
    compact = Attestor(_DocumentsClient(documents, "vm0"), attach_every=3600)  # type: ignore[arg-type]
    full.begin()
    compact.begin()
    vm_id = from_spec({"name": "vm0"}).vmId
    body = json.dumps({"data": {"vm": {"vmId": vm_id}}, "pad": "x" * ENVELOPE_BYTES}).encode()
    now = dt.datetime.now(dt.timezone.utc)

    with_doc = full.sign(body)
    first = compact.sign(body)  # the send's first event carries the document
    without_doc = compact.sign(body)
    size_full = sum(len(k) + len(v) for k, v in with_doc.items())
    size_compact = sum(len(k) + len(v) for k, v in without_doc.items())
    print(f"application properties per event: {size_full} bytes with the attested document, "
          f"{size_compact} bytes without (key id + signature); envelope body here {len(body)} bytes")

    assert authn.verify(body, with_doc, trust, now, vm_id).ok
    key = authn.verify(body, first, trust, now, vm_id)
    assert isinstance(key, authn.Authenticated), key
    assert authn.verify(body, without_doc, trust, now, vm_id, known=key.key).ok
    cache: dict = {}
    sign = show("forwarder sign (Ed25519, one event)", runs(lambda: full.sign(body), 2000), "us")
    cold = show("central verify, document not seen before (PKCS#7 + chain + Ed25519)",
                runs(lambda: authn.verify(body, with_doc, trust, now, vm_id), 200), "us")
    cached = show("central verify, document already verified by this instance",
                  runs(lambda: authn.verify(body, with_doc, trust, now, vm_id, cache=cache), 2000), "us")
    known = show("central verify, key id only + key from the store",
                 runs(lambda: authn.verify(body, without_doc, trust, now, vm_id, known=key.key), 2000), "us")
    record([Figure("authn_cost", "event bytes added (document / key id only)", size_full, "B"),
            Figure("authn_cost", "event bytes added, key id only", size_compact, "B"),
            Figure("authn_cost", "forwarder sign per event", sign, "us"),
            Figure("authn_cost", "central verify, first sight of a document", cold, "us"),
            Figure("authn_cost", "central verify, cached document", cached, "us"),
            Figure("authn_cost", "central verify, known key", known, "us")])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
