"""The approval queue's identity is its own setting (`queue_client_id`), not the hub's `client_id`:
empty = the VM's system-assigned identity, which the infra install gives each VM and scopes to that
VM's queue only (docs/deploy.md). Shown on the real token path: azure-identity's
ManagedIdentityCredential asks the IMDS simulator, which records each token request's query.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest

from forwarder import config as cfg
from forwarder.app import approval_settings
from forwarder.ratelimit import RateLimiter
from sandbox import processes
from tests.forwarder.helpers import admin, imds_url

HUB_IDENTITY = "11111111-2222-3333-4444-555555555555"
QUEUE_IDENTITY = "66666666-7777-8888-9999-000000000000"


def _queue_token_query(imds_server: processes.Server, monkeypatch: pytest.MonkeyPatch,
                       env: Dict[str, str]) -> Dict[str, Any]:
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", imds_url(imds_server))
    admin(imds_server, "DELETE", "/requests")
    config = cfg.load({}, {"SE_FORWARDER_QUEUE_SERVICE_URI": "https://acct.queue.core.windows.net",
                           "SE_FORWARDER_CLIENT_ID": HUB_IDENTITY, **env})
    settings = approval_settings(config, RateLimiter())
    token = settings.credential().get_token("https://storage.azure.com/.default")  # made on first need
    assert token.token
    (request,) = admin(imds_server, "GET", "/requests?path=/metadata/identity/oauth2/token")
    return request["query"]


def test_the_queue_uses_the_system_assigned_identity_by_default(
        imds_server: processes.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    query = _queue_token_query(imds_server, monkeypatch, {})
    assert "client_id" not in query  # no client id: IMDS answers with the system-assigned identity
    assert HUB_IDENTITY not in str(query)


def test_queue_client_id_picks_a_user_assigned_identity(
        imds_server: processes.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    query = _queue_token_query(imds_server, monkeypatch, {"SE_FORWARDER_QUEUE_CLIENT_ID": QUEUE_IDENTITY})
    assert query["client_id"] == QUEUE_IDENTITY


def test_check_takes_a_token_from_each_identity_for_the_resource_it_serves(
        imds_server: processes.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """`se-forwarder check`: the hub's token from client_id, the queue's from queue_client_id."""
    from forwarder.check import Report, _identity

    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", imds_url(imds_server))
    admin(imds_server, "DELETE", "/requests")
    config = cfg.load({}, {"SE_FORWARDER_QUEUE_SERVICE_URI": "https://acct.queue.core.windows.net",
                           "SE_FORWARDER_EVENTHUB_NAMESPACE": "ns.servicebus.windows.net",
                           "SE_FORWARDER_EVENTHUB_NAME": "hub",
                           "SE_FORWARDER_CLIENT_ID": HUB_IDENTITY,
                           "SE_FORWARDER_QUEUE_CLIENT_ID": QUEUE_IDENTITY})
    report = Report()
    found = _identity(config, report)
    assert set(found) == {"sink", "queue"} and found["sink"] is not found["queue"]
    lines = [line.detail for line in report.lines]
    assert any(HUB_IDENTITY in d and "eventhubs" in d for d in lines), lines
    assert any(QUEUE_IDENTITY in d and "storage" in d for d in lines), lines
    asked = admin(imds_server, "GET", "/requests?path=/metadata/identity/oauth2/token")
    assert sorted(r["query"].get("client_id") for r in asked) == sorted([HUB_IDENTITY, QUEUE_IDENTITY])


def test_the_queue_shares_the_hubs_credential_only_when_both_name_one_identity() -> None:
    from forwarder.app import SharedCredential, queue_identity

    limiter = RateLimiter()
    hub = SharedCredential(HUB_IDENTITY, limiter)
    same = cfg.load({}, {"SE_FORWARDER_CLIENT_ID": HUB_IDENTITY,
                         "SE_FORWARDER_QUEUE_CLIENT_ID": HUB_IDENTITY})
    assert queue_identity(same, limiter, hub=hub) is hub
    own = cfg.load({}, {"SE_FORWARDER_CLIENT_ID": HUB_IDENTITY})  # queue: the system-assigned identity
    assert queue_identity(own, limiter, hub=hub) is not hub
