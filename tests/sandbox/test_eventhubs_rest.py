"""The sandbox's Event Hubs REST front (sandbox/eventhubs/rest.py), its pure parts: token checks and the
request body -> events mapping (the end-to-end path is tests/forwarder_eventhubs/test_rest_sink.py)."""

from __future__ import annotations

import json
import time

import pytest

from sandbox.eventhubs.rest import BATCH_TYPE, HttpError, RestFront, messages_of, token_problem
from sandbox.eventhubs.store import Broker
from sandbox.imds.metadata import sandbox_token


class Ident:
    vmId = "vm-1"
    resourceId = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/vm-1"


def test_tokens_are_checked_for_shape_audience_and_lifetime() -> None:
    now = int(time.time())
    good = sandbox_token(Ident(), "https://eventhubs.azure.net", now)
    assert token_problem(f"Bearer {good}", now) == ""
    assert "InvalidAudience" in token_problem(
        f"Bearer {sandbox_token(Ident(), 'https://storage.azure.com', now)}", now)
    assert "ExpiredToken" in token_problem(
        f"Bearer {sandbox_token(Ident(), 'https://eventhubs.azure.net', now - 7200, lifetime=60)}", now)
    assert token_problem("", now) and token_problem("Bearer not-a-jwt", now)
    assert token_problem("SharedAccessSignature sr=x&sig=y&se=1&skn=k", now) == ""


def test_a_batch_maps_to_events_with_properties_and_keys() -> None:
    body = json.dumps([{"Body": "{\"a\":1}", "UserProperties": {"p": "v"},
                        "BrokerProperties": {"PartitionKey": "k"}}, {"Body": "é"}]).encode()
    assert messages_of(BATCH_TYPE, body, {}) == [(b'{"a":1}', {"p": "v"}, "k"), ("é".encode(), {}, None)]
    single = messages_of("application/json", b"raw", {"brokerproperties": '{"PartitionKey": "x"}'})
    assert single == [(b"raw", {}, "x")]
    for bad in (b"{", b'{"Body": "x"}', b'[{"Body": 1}]', b'[{"Body": "x", "UserProperties": []}]'):
        with pytest.raises(HttpError) as info:
            messages_of(BATCH_TYPE, bad, {})
        assert info.value.status == 400


def test_the_front_answers_as_documented() -> None:
    broker = Broker()
    broker.add_hub("h", 2, None)
    front = RestFront(broker, max_message=100)
    token = sandbox_token(Ident(), "https://eventhubs.azure.net", int(time.time()))
    auth = {"authorization": f"Bearer {token}", "content-type": BATCH_TYPE}
    batch = json.dumps([{"Body": "x", "BrokerProperties": {"PartitionKey": "k"}}]).encode()
    assert front.answer("POST", "/h/messages?api-version=2014-01", auth, batch)[0] == 201
    assert sum(len(p.read(0, 10)) for p in broker.hub("h").partitions) == 1
    assert front.answer("POST", "/h/messages", {}, batch)[0] == 401
    assert front.answer("POST", "/nope/messages", auth, batch)[0] == 404
    assert front.answer("POST", "/h/messages", auth, b"[" + b'{"Body":"' + b"x" * 200 + b'"}]')[0] == 413
    assert front.answer("POST", "/$sandbox/faults", {}, b'{"status": 429, "retryAfter": 2}')[0] == 201
    status, headers, _ = front.answer("POST", "/h/messages", auth, batch)
    assert status == 429 and headers["Retry-After"] == "2"
    assert front.answer("POST", "/h/messages", auth, batch)[0] == 201  # the fault was for one request
    broker.close()
