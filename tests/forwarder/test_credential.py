"""The managed-identity token client (forwarder/credential.py) against the IMDS simulator's token endpoint:
the wire request, transient refusals retried, refresh at half-life, expiry, a user-assigned identity."""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Dict, List

import pytest

from forwarder.credential import (
    AccessToken,
    ManagedIdentityCredential,
    TokenUnavailable,
    parse_token,
    retry_after,
)
from forwarder.imds_http import Answer
from forwarder.ratelimit import RateLimiter
from sandbox import processes

from .helpers import admin, imds_url

EH = "https://eventhubs.azure.net/.default"


def token_calls(server: processes.Server) -> List[Dict[str, Any]]:
    return [r for r in admin(server, "GET", "requests?vm=vm0") if "oauth2/token" in r["path"]]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def claims(token: str) -> Dict[str, Any]:
    return json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "==="))


def test_the_request_is_the_documented_one(imds_server: processes.Server) -> None:
    credential = ManagedIdentityCredential("11111111-2222-3333-4444-555555555555", RateLimiter(),
                                           authority=imds_url(imds_server))
    token = credential.get_token(EH)
    (call,) = token_calls(imds_server)
    assert call["method"] == "GET" and call["path"].endswith("/metadata/identity/oauth2/token")
    assert call["query"] == {"api-version": "2018-02-01", "resource": "https://eventhubs.azure.net",
                             "client_id": "11111111-2222-3333-4444-555555555555"}
    assert call["headers"].get("Metadata") == "true"
    assert claims(token.token)["aud"] == "https://eventhubs.azure.net"
    assert isinstance(token, AccessToken) and token.expires_on == int(claims(token.token)["exp"])


@pytest.mark.parametrize("status", [410, 429, 500, 503])
def test_transient_refusals_are_retried(imds_server: processes.Server, status: int) -> None:
    admin(imds_server, "POST", "faults", {"kind": "status", "path": "token", "status": status, "count": 2})
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server))
    assert credential.get_token(EH).token
    assert [c["status"] for c in token_calls(imds_server)] == [status, status, 200]


def test_a_refusal_that_is_not_transient_is_not_retried_and_says_what_to_do(
        imds_server: processes.Server) -> None:
    admin(imds_server, "POST", "faults", {"kind": "status", "path": "token", "status": 400, "count": 5})
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server))
    with pytest.raises(TokenUnavailable, match=r"HTTP 400.*client_id"):
        credential.get_token(EH)
    assert len(token_calls(imds_server)) == 1


def test_refreshed_at_half_life_and_the_cached_token_kept_while_refresh_fails(
        imds_server: processes.Server) -> None:
    clock = Clock(time.time())
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server), clock=clock)
    first = credential.get_token(EH)
    life = first.expires_on - clock.now
    clock.now += life / 2 - 60  # before half-life: the cache answers
    assert credential.get_token(EH) == first and len(token_calls(imds_server)) == 1
    clock.now += 120  # past half-life: refreshed
    refreshed_at = clock.now
    second = credential.get_token(EH)
    assert len(token_calls(imds_server)) == 2  # (the same second: IMDS may answer the same token)
    # Past the next half-life, IMDS refusing every attempt: the token in hand is still good, so it is used.
    clock.now = (refreshed_at + second.expires_on) / 2 + 60
    admin(imds_server, "POST", "faults", {"kind": "status", "path": "token", "status": 500, "count": 50})
    kept = credential.get_token(EH)
    assert len(token_calls(imds_server)) == 2 + 5 and kept == second and kept.expires_on - clock.now > 300
    # Within 5 minutes of its expiry it is never handed out: the failure shows.
    clock.now = kept.expires_on - 120
    with pytest.raises(TokenUnavailable, match="HTTP 500"):
        credential.get_token(EH)


def test_no_answer_is_a_token_unavailable_not_a_traceback() -> None:
    credential = ManagedIdentityCredential("", RateLimiter(), authority="http://127.0.0.1:9")
    with pytest.raises(TokenUnavailable, match="did not answer"):
        credential.get_token(EH)


def test_parse_and_retry_after_pure() -> None:
    token, refresh_at = parse_token(json.dumps({"access_token": "t", "expires_in": "3600",
                                                "expires_on": "4600"}), 1000.0)
    assert token == AccessToken("t", 4600) and refresh_at == 2800.0
    token, _ = parse_token(json.dumps({"access_token": "t", "expires_in": 60}), 1000.0)
    assert token.expires_on == 1060
    with pytest.raises(ValueError):
        parse_token("{}", 0.0)
    assert retry_after(Answer(429, {"Retry-After": "7"}, "")) == 7.0
    assert retry_after(Answer(429, {"retry-after": "soon"}, "")) is None
    assert retry_after(Answer(503, {}, "")) is None


def test_the_sinks_and_queues_credential_takes_the_vms_limiter_and_the_imds_transport() -> None:
    """What forwarder.imds.managed_identity_credential hands the REST sink and queue: the VM's one IMDS budget
    and the http.client transport (HTTP(S)_PROXY never applies to IMDS)."""
    from forwarder.imds import managed_identity_credential

    limiter = RateLimiter()
    credential = managed_identity_credential("00000000-0000-0000-0000-000000000001", limiter)
    assert isinstance(credential, ManagedIdentityCredential) and credential.limiter is limiter
    assert type(credential.http).__name__ == "ImdsHttp"
    credential.close()


def test_a_forgotten_token_is_asked_for_again_and_only_for_its_resource(
        imds_server: processes.Server) -> None:
    """What the REST sink and queue do when a service refuses a token (401 / AuthenticationFailed): forget()
    drops that resource's cached token, so the next get_token goes to IMDS; another resource's stays."""
    credential = ManagedIdentityCredential("", RateLimiter(), authority=imds_url(imds_server))
    storage = "https://storage.azure.com/.default"
    credential.get_token(EH)
    credential.get_token(storage)
    credential.get_token(EH)  # cached: no call
    assert len(token_calls(imds_server)) == 2
    credential.forget(EH)
    credential.get_token(EH)
    credential.get_token(storage)  # still cached
    calls = token_calls(imds_server)
    assert len(calls) == 3 and "eventhubs" in calls[-1]["query"]["resource"], calls
    credential.close()
