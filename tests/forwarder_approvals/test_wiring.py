"""Settings -> approval parts: the managed identity path and the settings table rows."""

from __future__ import annotations

import pytest

from forwarder import config as cfg
from forwarder.app import SharedCredential, approval_settings
from forwarder.approvals import queue
from forwarder.credential import ManagedIdentityCredential
from forwarder.ratelimit import RateLimiter


def test_service_uri_uses_the_managed_identity_made_when_first_needed() -> None:
    config = cfg.load({}, {"SE_FORWARDER_QUEUE_SERVICE_URI": "https://acct.queue.core.windows.net",
                           "SE_FORWARDER_CLIENT_ID": "11111111-2222-3333-4444-555555555555"})
    limiter = RateLimiter()
    settings = approval_settings(config, limiter)
    assert isinstance(settings.credential, SharedCredential)  # nothing made (nor imported) yet
    credential = settings.credential()
    assert isinstance(credential, ManagedIdentityCredential) and credential.http.limiter is limiter
    assert settings.credential() is credential  # one credential, one token cache
    client = queue.queue_client("vm-x", settings.queue_service_uri, None, credential)
    assert client.url.startswith("https://acct.queue.core.windows.net/vm-x")
    assert client.credential is credential  # no key, no SAS: the identity only
    client.close()
    credential.close()


def test_connection_string_needs_no_credential_and_settings_parse() -> None:
    config = cfg.load({}, {"SE_FORWARDER_QUEUE_CONNECTION_STRING": "UseDevelopmentStorage=true",
                           "SE_FORWARDER_LOCAL_APPROVE": "yes", "SE_FORWARDER_LOCAL_EVENT_TYPES": "Preempt",
                           "SE_FORWARDER_APPROVAL_FAST_INTERVAL": "0.5", "SE_FORWARDER_HOOK_TIMEOUT": "7",
                           "SE_FORWARDER_REQUIRE_PRE_APPROVE_HOOK": "on"})
    settings = approval_settings(config)
    assert settings.credential is None and settings.queue_enabled
    assert settings.local_approve is True and tuple(settings.local_event_types) == ("Preempt",)
    assert settings.reader.fast_interval == 0.5 and settings.hooks.timeout_seconds == 7.0
    assert settings.require_hook is True
    assert cfg.BY_KEY["queue_connection_string"].secret
    assert config.as_dict()["queue_connection_string"] == "***"


def test_defaults_and_bad_values() -> None:
    config = cfg.load({}, {})
    settings = approval_settings(config)
    assert not settings.queue_enabled and settings.local_approve is False and settings.require_hook is False
    assert tuple(settings.local_event_types) == ("Preempt", "Terminate")
    assert (settings.reader.fast_interval, settings.reader.slow_interval) == (2.0, 60.0)
    with pytest.raises(cfg.ConfigError, match="local_approve"):
        cfg.load({}, {"SE_FORWARDER_LOCAL_APPROVE": "maybe"})
