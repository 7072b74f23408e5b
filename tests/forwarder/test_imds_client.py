"""The IMDS client against the simulator over real HTTP: headers, proxy bypass, retries, approvals."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, List

import pytest
import requests

from forwarder.credential import ManagedIdentityCredential
from forwarder.imds import ImdsClient, ImdsRejected, ImdsUnavailable
from forwarder.ratelimit import RateLimiter
from sandbox import processes

from .helpers import admin, imds_url


class _RecordingProxy(BaseHTTPRequestHandler):
    seen: List[str] = []

    def _record(self) -> None:
        type(self).seen.append(f"{self.command} {self.path}")
        self.send_response(502)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_CONNECT = _record

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recording_proxy() -> Iterator[str]:
    _RecordingProxy.seen = []
    server = ThreadingHTTPServer((processes.LOOPBACK, 0), _RecordingProxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{processes.LOOPBACK}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def requests_log(server: processes.Server, path: str = "") -> list:
    return admin(server, "GET", f"requests?vm=vm0{'&path=' + path if path else ''}")


def test_headers_and_query_follow_the_imds_rules(imds_server: processes.Server) -> None:
    client = ImdsClient(imds_url(imds_server))
    response = client.get_scheduled_events()
    assert response.status == 200 and response.json()["Events"] == []
    logged = [r for r in requests_log(imds_server) if "scheduledevents" in r["path"]]
    assert len(logged) == 1
    headers = {k.lower(): v for k, v in logged[0]["headers"].items()}
    assert headers.get("metadata") == "true"
    assert "x-forwarded-for" not in headers
    assert "2020-07-01" in str(logged[0]["query"])


def test_imds_is_never_reached_through_a_proxy(imds_server: processes.Server, recording_proxy: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, recording_proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    # Control: an ordinary requests call honours the env and hits the proxy (so the proxy works).
    assert requests.get(f"{imds_url(imds_server)}/metadata/scheduledevents", timeout=5).status_code == 502
    assert len(_RecordingProxy.seen) == 1
    client = ImdsClient(imds_url(imds_server))
    assert client.get_compute()["name"] == "vm0"
    assert client.get_scheduled_events().status == 200
    assert len(_RecordingProxy.seen) == 1  # the client never went through it


@pytest.mark.parametrize("status", [500, 410, 429, 503])
def test_retryable_statuses_are_retried_then_succeed(imds_server: processes.Server, status: int) -> None:
    admin(imds_server, "POST", "faults", {"kind": "status", "status": status, "count": 3})
    client = ImdsClient(imds_url(imds_server), backoff_base=0.05, backoff_cap=0.2)
    response = client.get_scheduled_events()
    assert response.status == 200 and response.attempts == 4
    assert client.health.retries == 3 and client.health.failures == 3


def test_a_slow_answer_times_out_and_is_retried(imds_server: processes.Server) -> None:
    client = ImdsClient(imds_url(imds_server), timeout=0.5, backoff_base=0.05, backoff_cap=0.2)
    client.get_scheduled_events()  # the first call (long timeout) has been answered
    admin(imds_server, "POST", "faults", {"kind": "slow", "seconds": 2, "count": 1})
    response = client.get_scheduled_events()
    assert response.attempts == 2 and "Timeout" in (client.health.last_error or "")


def test_a_refusal_is_not_retried_and_says_what_to_do(imds_server: processes.Server) -> None:
    client = ImdsClient(imds_url(imds_server), api_version="2016-01-01")
    with pytest.raises(ImdsRejected, match="api-version") as info:
        client.get_scheduled_events()
    assert info.value.status == 400
    assert len([r for r in requests_log(imds_server) if "scheduledevents" in r["path"]]) == 1


def test_no_answer_raises_unavailable_after_the_budget() -> None:
    port = processes.free_port()
    client = ImdsClient(f"http://{processes.LOOPBACK}:{port}", retry_seconds=0.5, backoff_base=0.05,
                        backoff_cap=0.1)
    with pytest.raises(ImdsUnavailable, match=r"169\.254\.169\.254") as info:
        client.get_scheduled_events()
    assert "ConnectionError" in str(info.value) and client.health.requests >= 2


def test_start_events_approves(imds_server: processes.Server) -> None:
    created = admin(imds_server, "POST", "events", {"eventType": "Reboot", "eventSource": "User",
                                                    "noticeSeconds": 900})
    client = ImdsClient(imds_url(imds_server))
    assert client.start_events([created["eventId"]]).status == 200
    posts = [r for r in requests_log(imds_server) if r["method"] == "POST"]
    assert posts and created["eventId"] in str(posts[-1]["body"])
    event = next(e for e in admin(imds_server, "GET", "events") if e["eventId"] == created["eventId"])
    assert event["status"] == "Started"
    with pytest.raises(ValueError):
        client.start_events([])


def test_the_shared_limiter_keeps_a_burst_under_the_imds_limit(imds_server: processes.Server) -> None:
    """Polls and token requests interleaved through one limiter: never a 429 from IMDS."""
    limiter = RateLimiter()
    client = ImdsClient(imds_url(imds_server), limiter=limiter)
    tokens = ManagedIdentityCredential("", limiter, authority=imds_url(imds_server))
    for n in range(6):
        client.get_scheduled_events()
        tokens.get_token(f"https://x{n}.example/.default")  # a new resource each time: no cache hit
    statuses = [r["status"] for r in requests_log(imds_server)]
    assert statuses.count(200) >= 12 and 429 not in statuses
    assert tokens.requests == 6 and client.health.retries == 0
    tokens.close()


def test_managed_identity_tokens_come_from_imds_once_then_from_the_cache(
        imds_server: processes.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The IMDS token endpoint over http.client, found through azure-identity's own
    AZURE_POD_IDENTITY_AUTHORITY_HOST; a cached token costs no IMDS request; proxies never apply."""
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", f"http://{processes.LOOPBACK}:{imds_server.port}")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # would break the token call if honoured
    limiter = RateLimiter()
    credential = ManagedIdentityCredential("", limiter)
    first = credential.get_token("https://eventhubs.azure.net/.default")
    again = credential.get_token("https://eventhubs.azure.net/.default")
    other = credential.get_token("https://storage.azure.com/.default")
    credential.close()
    monkeypatch.delenv("HTTP_PROXY")
    assert first.token == again.token and first.token != other.token
    _header, claims, _ = first.token.split(".")
    assert json.loads(base64.urlsafe_b64decode(claims + "==="))["aud"] == "https://eventhubs.azure.net"
    assert first.expires_on > time.time() + 3600
    token_calls = [r for r in requests_log(imds_server) if "oauth2/token" in r["path"]]
    assert len(token_calls) == 2 == credential.requests  # one per resource, each inside the budget
    assert all(r["headers"].get("Metadata") == "true" for r in token_calls)
    with pytest.raises(ValueError):
        credential.get_token("a", "b")


def test_the_first_call_may_take_long_later_calls_may_not(tmp_path: Path) -> None:
    server = processes.start_imds(["--first-call-delay", "1.5"], log_dir=tmp_path)
    try:
        client = ImdsClient(imds_url(server), timeout=0.5, first_timeout=120.0)
        first = client.get_compute()  # answered after 1.5 s: within the first-call timeout, no retry
        assert first["name"] == "vm0" and client.health.retries == 0
        assert client._timeout() == (client.connect_timeout, 0.5)  # from now on, the short timeout
    finally:
        server.stop()
