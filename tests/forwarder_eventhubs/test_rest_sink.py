"""The REST sink (forwarder/sinks/eventhub_rest.py) against the sandbox server's REST send endpoint over real
HTTP, tokens from the IMDS simulator, every event read back by the unmodified azure-eventhub consumer
(and compared with the same envelope sent by the AMQP sink): body, properties, partition key, partition;
throttling with Retry-After, an expired token, batches split at the size limit."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import requests
from azure.eventhub import EventHubConsumerClient

from forwarder.credential import ManagedIdentityCredential
from forwarder.outbox import Outbox
from forwarder.publisher import Publisher
from forwarder.ratelimit import RateLimiter
from forwarder.sinks.base import SinkError
from forwarder.sinks.eventhub import EventHubSettings, EventHubSink
from forwarder.sinks.eventhub_rest import MAX_REQUEST, EventHubRestSink, batch_item, requests_for
from sandbox import processes
from tests.forwarder.helpers import ExpiringCredential

from .helpers import HUB, imds_url, wait_until


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[processes.Server]:
    server = processes.start_eventhubs([f"{HUB}=4"], log_dir=tmp_path, rest=True)
    yield server
    server.stop()


class Signer:
    """Stands for forwarder/attestation.py's Attestor at the sink's interface: begin(), sign(body)."""

    def begin(self, subscription: str = "") -> None:
        pass

    def sign(self, body: bytes) -> Dict[str, str]:
        return {"se-auth": "1", "se-auth-kid": "k1", "se-auth-sig": f"len{len(body)}"}


def rest_sink(server: processes.Server, credential: Any, signer: Any = None) -> EventHubRestSink:
    settings = EventHubSettings(namespace=f"{processes.LOOPBACK}:{server.ports['rest']}", eventhub_name=HUB,
                                use_tls=False, send_timeout=5.0)
    return EventHubRestSink(settings, credential, authenticator=signer)


def envelope(vm: str, n: int, pad: int = 0) -> Dict[str, Any]:
    return {"specversion": "1.0", "id": f"{vm}:incarnation:{n}:x", "source": f"vm://{vm}",
            "type": "scheduledevents.incarnation.v1", "subject": vm, "time": "2026-11-21T00:00:00.000Z",
            "datacontenttype": "application/json", "partitionkey": vm,
            "data": {"vm": {"vmId": vm, "name": vm}, "incarnation": n, "pad": "p" * pad, "é": "ü"}}


def read_all(server: processes.Server, count: int) -> List[Tuple[str, int, Any, Dict, bytes]]:
    """(partition, sequence, partition key, properties, body) of `count` events, via the SDK's consumer."""
    got: List[Tuple[str, int, Any, Dict, bytes]] = []
    lock = threading.Lock()
    conn = processes.eventhubs_connection_string(server.port, HUB)

    def on_event(context: Any, event: Any) -> None:
        if event is not None:
            with lock:
                got.append((context.partition_id, event.sequence_number,
                            event.system_properties.get(b"x-opt-partition-key"),
                            {k.decode(): v.decode() for k, v in (event.properties or {}).items()},
                            b"".join(event.body)))

    clients = []
    for pid in ("0", "1", "2", "3"):
        client = EventHubConsumerClient.from_connection_string(conn, consumer_group="$Default")
        clients.append(client)
        threading.Thread(target=client.receive, daemon=True, kwargs={
            "on_event": on_event, "partition_id": pid, "starting_position": "-1"}).start()
    try:
        wait_until(lambda: len(got) >= count, timeout=30, what=f"{count} events")
    finally:
        for client in clients:
            threading.Thread(target=client.close, daemon=True).start()
    return sorted(got, key=lambda g: (g[0], g[1]))


class CountingLimiter(RateLimiter):
    acquired = 0

    def acquire(self, *args: Any, **kwargs: Any) -> float:
        self.acquired += 1
        return super().acquire(*args, **kwargs)


def test_rest_events_read_back_like_amqp_ones(hub: processes.Server, imds_server: processes.Server,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The same envelopes through the REST sink (managed identity: the production path) and the AMQP sink
    (connection string): the consumer reads identical bodies, properties and partition keys, in the same
    partition, in order. The token comes from IMDS inside the VM's budget, never through a proxy."""
    limiter = CountingLimiter()
    credential = ManagedIdentityCredential("", limiter, authority=imds_url(imds_server))
    sent = [envelope("vmss-a", n) for n in range(3)]
    rest = rest_sink(hub, credential, Signer())
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # would break the token or the send if honoured
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    rest.send(sent)
    rest.close()
    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.delenv("http_proxy")
    conn = processes.eventhubs_connection_string(hub.port, HUB)
    amqp = EventHubSink(EventHubSettings(connection_string=conn), authenticator=Signer())
    amqp.send(sent)
    amqp.close()
    got = read_all(hub, 6)
    by_rest, by_amqp = got[:3], got[3:]
    assert [json.loads(g[4]) for g in by_rest] == sent == [json.loads(g[4]) for g in by_amqp]
    assert [g[4] for g in by_rest] == [g[4] for g in by_amqp]  # byte for byte (compact JSON, UTF-8)
    assert [g[3] for g in by_rest] == [g[3] for g in by_amqp] and by_rest[0][3]["se-auth-kid"] == "k1"
    assert {g[2] for g in got} == {b"vmss-a"} and len({g[0] for g in got}) == 1
    assert rest.requests == 1  # one run, one batch request
    token_calls = [r for r in requests.get(f"http://{processes.LOOPBACK}:{imds_server.port}/admin/requests"
                                           "?vm=vm0", timeout=5).json() if "oauth2/token" in r["path"]]
    assert len(token_calls) == 1 and "eventhubs.azure.net" in token_calls[0]["query"]["resource"]
    assert limiter.acquired >= len(token_calls)  # the token call took a slot of the VM's IMDS budget


def test_throttling_is_retried_no_sooner_than_retry_after(hub: processes.Server,
                                                          imds_server: processes.Server) -> None:
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server))
    sink = rest_sink(hub, credential)
    url = f"http://{processes.LOOPBACK}:{hub.ports['rest']}/$sandbox/faults"
    for status in (429, 503):
        assert requests.post(url, json={"status": status, "count": 1, "retryAfter": 3}, timeout=5).ok
        with pytest.raises(SinkError, match=f"HTTP {status}") as info:
            sink.send([envelope("vm-t", status)])
        assert info.value.retryable and info.value.retry_after == 3.0
    sink.send([envelope("vm-t", 1)])
    assert [json.loads(g[4])["data"]["incarnation"] for g in read_all(hub, 1)] == [1]
    sink.close()


def test_the_publisher_waits_out_retry_after(tmp_path: Path) -> None:
    class Throttled:
        name = "throttled"

        def send(self, envelopes: List[Dict[str, Any]]) -> None:
            error = SinkError("HTTP 503")
            error.retry_after = 4.0
            raise error

    outbox = Outbox(tmp_path)
    outbox.put(envelope("vm", 1))
    waits: List[float] = []

    class Stop:
        def wait(self, seconds: float) -> bool:
            waits.append(seconds)
            return True

    publisher = Publisher(outbox, Throttled(), max_delay=30.0)
    for _ in range(5):  # the backoff's own delay starts at <= 0.5 s: each wait is Retry-After's 4 s or more
        publisher.step(Stop())  # type: ignore[arg-type]
    assert len(waits) == 5 and min(waits) >= 4.0 and len(outbox.peek(10)) == 1
    outbox.close()


def test_an_expired_token_is_refused_forgotten_and_replaced(hub: processes.Server) -> None:
    credential = ExpiringCredential("https://eventhubs.azure.net")
    sink = rest_sink(hub, credential)
    with pytest.raises(SinkError, match=r"HTTP 401.*ExpiredToken") as info:
        sink.send([envelope("vm-e", 1)])
    assert info.value.retryable and credential.forgotten == ["https://eventhubs.azure.net/.default"]
    sink.send([envelope("vm-e", 1)])
    assert len(read_all(hub, 1)) == 1
    sink.close()


def test_an_unknown_hub_is_not_retryable(hub: processes.Server, imds_server: processes.Server) -> None:
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server))
    settings = EventHubSettings(namespace=f"{processes.LOOPBACK}:{hub.ports['rest']}", eventhub_name="nope",
                                use_tls=False)
    sink = EventHubRestSink(settings, credential)
    with pytest.raises(SinkError, match="HTTP 404") as info:
        sink.send([envelope("vm-n", 1)])
    assert not info.value.retryable
    sink.close()


def test_batches_split_at_the_limit_and_an_oversize_envelope_becomes_a_note(
        hub: processes.Server, imds_server: processes.Server) -> None:
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server))
    sink = rest_sink(hub, credential)
    sent = [envelope("vm-b", n, pad=300_000) for n in range(5)] + [envelope("vm-b", 5, pad=MAX_REQUEST)]
    sink.send(sent)
    got = [json.loads(g[4]) for g in read_all(hub, 6)]
    assert [g["id"] for g in got[:5]] == [e["id"] for e in sent[:5]]
    assert got[5]["id"] == sent[5]["id"] + ":oversize" and got[5]["type"].endswith("quarantined.v1")
    assert sink.requests == 2 and sink.oversize_replaced == 1  # three 300 KB per 1 MB request; 2 + the note
    sink.close()


def test_requests_for_packs_in_order_under_the_limit() -> None:
    items = [batch_item(b'{"a":%d}' % n, "k", None) for n in range(10)]
    packed = requests_for(items, limit=len(items[0]) * 3 + 4)
    assert [len(json.loads(p)) for p in packed] == [3, 3, 3, 1]
    assert [json.loads(x["Body"])["a"] for p in packed for x in json.loads(p)] == list(range(10))
    assert all(len(p) <= len(items[0]) * 3 + 4 for p in packed)


def test_every_tls_connection_reuses_the_processs_one_context(
        hub: processes.Server, imds_server: processes.Server, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After an idle close the next send opens a new connection; it must not make a new TLS context each
    time (a CA store and the CA read from disk per heartbeat). The approval queue shares that context."""
    import subprocess

    from bench.tlsrelay import TlsRelay, make_certificate
    from forwarder.sinks import tls_trust

    cert, key = make_certificate(tmp_path)
    digest = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(cert)], capture_output=True,
                            text=True, check=True, timeout=30).stdout.strip()
    cadir = tmp_path / "ca"
    cadir.mkdir()
    (cadir / f"{digest}.0").write_bytes(cert.read_bytes())  # the VM's hashed CA directory, as in Azure
    monkeypatch.setenv("SSL_CERT_DIR", str(cadir))
    made: List[Any] = []
    original = tls_trust.tls_context

    def counted() -> Any:
        made.append(original())
        return made[-1]

    monkeypatch.setattr(tls_trust, "tls_context", counted)
    tls_trust._made_for.cache_clear()  # this test's CA directory: a context of its own
    relay = TlsRelay(cert, key, hub.ports["rest"])
    try:
        settings = EventHubSettings(namespace=f"{processes.LOOPBACK}:{relay.port}", eventhub_name=HUB,
                                    use_tls=True, send_timeout=5.0)
        sink = EventHubRestSink(settings, ManagedIdentityCredential("", RateLimiter(),
                                                                    authority=imds_url(imds_server)))
        for n in range(3):
            sink.send([envelope("vm-tls", n)])
            sink.release()  # the idle close: the next send connects again
        sink.close()
    finally:
        relay.stop()
    assert len(read_all(hub, 3)) == 3 and len(relay._threads) == 3  # three TLS connections
    assert len(made) == 1 and made[0] is not None  # one context, over the hashed CA directory
