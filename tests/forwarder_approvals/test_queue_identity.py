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
    token = settings.credential.get_token("https://storage.azure.com/.default")
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
