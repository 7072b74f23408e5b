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
    assert isinstance(credential, ManagedIdentityCredential) and credential.limiter is limiter
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


def test_a_result_names_the_identity_the_poller_read_last(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """After Azure moves the VM (another subscription or resource group), its approval results name the
    resourceId IMDS gives now, which central holds to the attested document, not the one of the first
    approval (they were refused as `subscription` until the forwarder restarted)."""
    from forwarder.approvals.result import APPROVED, ApprovalResult
    from forwarder.approvals.service import ApprovalService
    from forwarder.identity import from_compute
    from forwarder.outbox import Outbox

    def compute(sub: str) -> dict:
        rid = f"/subscriptions/{sub}/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm0"
        return {"vmId": "v-1", "name": "vm0", "resourceId": rid}

    current = {"identity": from_compute(compute("aaaa"))}
    outbox = Outbox(str(tmp_path))
    config = cfg.load({}, {"SE_FORWARDER_STATE_DIR": str(tmp_path)})
    service = ApprovalService(approval_settings(config), None, outbox, lambda: current["identity"])
    service._ready()  # the approver, built at the first approval with the identity of then
    service.publish(ApprovalResult("E-1", APPROVED, "first"))
    current["identity"] = from_compute(compute("bbbb"))
    service.publish(ApprovalResult("E-2", APPROVED, "after the move"))
    sent = [item.envelope["data"]["vm"]["resourceId"] for item in outbox.peek(10)]
    assert [rid.split("/")[2] for rid in sent] == ["aaaa", "bbbb"]
