"""App settings -> typed settings and SDK clients (the Azure Functions connection convention).

For connection prefix P (ApprovalStorage): either a setting P holding a connection string (Azurite
locally), or identity-based P__queueServiceUri / P__tableServiceUri with P__credential=managedidentity
and P__clientId (user-assigned identity) -> ManagedIdentityCredential; without P__credential,
DefaultAzureCredential (developer sign-in). Every name is listed in central/app_settings.json.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from azure.core.pipeline.transport import RequestsTransport

from central.intake.plan import HEARTBEAT_MISSING_MINUTES
from central.policy import coverage
from central.store.held import HELD_DAYS
from central.store.server_clock import ServerClock

from .alert_rules import DEFAULT_FLOOR, SEVERITIES
from .arm import DEFAULT_API_VERSION, DEFAULT_ENDPOINT

STORAGE_PREFIX = "ApprovalStorage"


class SettingsError(ValueError):
    """A required app setting is missing or unreadable; the message names it."""


def catalogue() -> Dict[str, Any]:
    """central/app_settings.json: the one list of setting names (infra and function_app read it too)."""
    return json.loads((Path(__file__).parent.parent / "app_settings.json").read_text(encoding="utf-8"))


class CountingTransport(RequestsTransport):
    """Counts HTTP requests (every attempt, retries included): the benchmark's Storage round trips."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests = 0

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return super().send(request, **kwargs)


LARGEST = 1e9  # seconds (~31 years), counts: past it a timedelta or an int of it overflows somewhere


def _number(settings: Mapping[str, str], name: str, default: float, least: float = 0.0) -> float:
    """A numeric app setting, `least` to LARGEST (float() also reads nan and inf: a traceback later that
    names no setting)."""
    text = (settings.get(name) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"app setting {name} must be a number, got {text!r}") from None
    if not math.isfinite(value) or not least <= value <= LARGEST:
        raise SettingsError(f"app setting {name} must be a number from {least:g} to {LARGEST:g}, "
                            f"got {text!r}")
    return value


@dataclass(frozen=True)
class CentralSettings:
    policy_json: str = ""
    shadow_json: str = ""  # POLICY_SHADOW_JSON: a candidate policy whose verdicts are recorded, never sent
    webhook_url: str = ""
    public_url: str = ""  # APP_PUBLIC_URL (https://<app host>): alerts link to the console's event page
    webhook_format: str = "generic"
    status_alert_floor: str = DEFAULT_FLOOR  # STATUS_ALERT_MIN_SEVERITY
    table_prefix: str = ""
    result_timeout: float = 120.0  # APPROVAL_RESULT_TIMEOUT_SECONDS
    hook_result_timeout: float = 360.0  # APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS
    liveness: float = 300.0  # LEADER_LIVENESS_SECONDS
    alert_attempts: int = 3  # ALERT_MAX_ATTEMPTS
    alert_backoff: float = 0.5  # ALERT_BACKOFF_SECONDS
    alert_timeout: float = 5.0  # ALERT_TIMEOUT_SECONDS
    authn_mode: str = "required"  # AUTHN_MODE: required | preferred | off
    authn_trust_pem: str = ""  # AUTHN_TRUST_PEM: roots/intermediates added to the shipped trust
    authn_metadata_domains: str = ""  # AUTHN_METADATA_DOMAINS (comma-separated); empty: public + US Gov
    authn_aia_hosts: str = ""  # AUTHN_AIA_HOSTS (comma-separated); empty: Microsoft's and DigiCert's
    authn_held_days: int = HELD_DAYS  # AUTHN_HELD_DAYS: days a trust-refused envelope is kept, re-verified
    report_grace: float = 120.0  # REPORT_GRACE_SECONDS (central.policy.witness)
    claims_per_hour: int = 4  # CLAIMS_COUNTED_PER_HOUR
    confirm_scopes: str = ""  # PLATFORM_CONFIRM_SCOPES
    confirm_grace: float = 300.0  # PLATFORM_CONFIRM_GRACE_SECONDS
    heartbeat_missing_minutes: float = HEARTBEAT_MISSING_MINUTES  # HEARTBEAT_MISSING_MINUTES (infra's alert)
    arm_endpoint: str = DEFAULT_ENDPOINT  # ARM_ENDPOINT (the deployment cloud's, from infra)
    arm_api_version: str = DEFAULT_API_VERSION  # ARM_API_VERSION (Microsoft.Maintenance acknowledge)
    coverage_scopes: Tuple[Tuple[str, ...], Tuple[str, ...]] = ((), ())  # COVERAGE_SCOPES: (subs, groups)
    coverage_principal_id: str = ""  # COVERAGE_PRINCIPAL_ID: central's identity, for agentless verdicts
    coverage_refresh: float = 300.0  # COVERAGE_REFRESH_SECONDS
    coverage_tag: str = "se-forwarder"  # COVERAGE_TAG

    @classmethod
    def from_mapping(cls, s: Mapping[str, str]) -> CentralSettings:
        prefix = (s.get("TABLE_PREFIX") or "").strip()
        if prefix and not re.fullmatch(
            r"[A-Za-z][A-Za-z0-9]{0,39}", prefix
        ):  # Table names: ASCII letters/digits
            raise SettingsError(
                f"TABLE_PREFIX must be letters and digits starting with a letter (<= 40), got {prefix!r}"
            )
        return cls(
            policy_json=s.get("POLICY_JSON") or "",
            shadow_json=s.get("POLICY_SHADOW_JSON") or "",
            webhook_url=(s.get("ALERT_WEBHOOK_URL") or "").strip(),
            public_url=_public_url(s),
            webhook_format=(s.get("ALERT_WEBHOOK_FORMAT") or "generic").strip().lower(),
            status_alert_floor=_status_alert_floor(s),
            table_prefix=prefix,
            # under a second no approval is ever sent; a liveness of 0 makes every VM silent (no leader)
            result_timeout=_number(s, "APPROVAL_RESULT_TIMEOUT_SECONDS", 120.0, least=1.0),
            # the forwarder's hook_timeout (300 s) and a POST: a drain the forwarder allows is not wasted
            hook_result_timeout=_number(s, "APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS", 360.0, least=1.0),
            liveness=_number(s, "LEADER_LIVENESS_SECONDS", 300.0, least=1.0),
            alert_attempts=max(1, int(_number(s, "ALERT_MAX_ATTEMPTS", 3))),
            alert_backoff=_number(s, "ALERT_BACKOFF_SECONDS", 0.5),
            alert_timeout=_number(s, "ALERT_TIMEOUT_SECONDS", 5.0),
            authn_trust_pem=s.get("AUTHN_TRUST_PEM") or "",
            authn_mode=(s.get("AUTHN_MODE") or "required").strip().lower(),
            authn_metadata_domains=(s.get("AUTHN_METADATA_DOMAINS") or "").strip(),
            authn_aia_hosts=(s.get("AUTHN_AIA_HOSTS") or "").strip(),
            authn_held_days=_held_days(s),
            report_grace=_number(s, "REPORT_GRACE_SECONDS", 120.0),
            claims_per_hour=int(_number(s, "CLAIMS_COUNTED_PER_HOUR", 4)),
            confirm_scopes=(s.get("PLATFORM_CONFIRM_SCOPES") or "").strip(),
            confirm_grace=_number(s, "PLATFORM_CONFIRM_GRACE_SECONDS", 300.0),
            heartbeat_missing_minutes=_heartbeat_missing_minutes(s),
            arm_endpoint=_arm_endpoint(s),
            arm_api_version=_arm_api_version(s),
            coverage_scopes=_coverage_scopes(s),
            coverage_principal_id=_coverage_principal(s),
            coverage_refresh=_number(s, "COVERAGE_REFRESH_SECONDS", 300.0, least=1.0),
            coverage_tag=(s.get("COVERAGE_TAG") or "").strip() or "se-forwarder",
        )


def _held_days(settings: Mapping[str, str]) -> int:
    """AUTHN_HELD_DAYS: whole days, 1 to 365 (Quarantine's partitions are UTC days)."""
    text = (settings.get("AUTHN_HELD_DAYS") or str(HELD_DAYS)).strip()
    if not text.isdigit() or not 1 <= int(text) <= 365:
        raise SettingsError(f"AUTHN_HELD_DAYS must be a whole number of days from 1 to 365, got {text!r}")
    return int(text)


def _status_alert_floor(settings: Mapping[str, str]) -> str:
    text = (settings.get("STATUS_ALERT_MIN_SEVERITY") or DEFAULT_FLOOR).strip().lower()
    if text not in SEVERITIES:
        raise SettingsError(f"STATUS_ALERT_MIN_SEVERITY must be one of {', '.join(SEVERITIES)}, "
                            f"got {text!r}")
    return text


def _heartbeat_missing_minutes(settings: Mapping[str, str]) -> float:
    minutes = _number(settings, "HEARTBEAT_MISSING_MINUTES", HEARTBEAT_MISSING_MINUTES)
    if not 5 <= minutes <= 1440:  # infra/main.bicep's heartbeatMissingMinutes bounds
        raise SettingsError(f"HEARTBEAT_MISSING_MINUTES must be 5 to 1440 (the heartbeats-missing alert's "
                            f"minutes, infra's heartbeatMissingMinutes), got {minutes:g}")
    return minutes


def _arm_endpoint(settings: Mapping[str, str]) -> str:
    text = (settings.get("ARM_ENDPOINT") or "").strip().rstrip("/") or DEFAULT_ENDPOINT
    local = re.fullmatch(r"http://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?", text)
    if not (re.fullmatch(r"https://[A-Za-z0-9.-]+(:\d+)?", text) or local):
        raise SettingsError(f"ARM_ENDPOINT must be the cloud's Resource Manager URL (https://<host>, e.g. "
                            f"https://management.azure.com; plain http only on loopback), got {text!r}")
    return text


def _coverage_scopes(settings: Mapping[str, str]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    try:
        subscriptions, groups = coverage.parse_scopes(settings.get("COVERAGE_SCOPES") or "")
    except ValueError as exc:
        raise SettingsError(f"COVERAGE_SCOPES: {exc} (comma-separated ARM ids; empty: no coverage read)") \
            from None
    return tuple(subscriptions), tuple(groups)


def _coverage_principal(settings: Mapping[str, str]) -> str:
    text = (settings.get("COVERAGE_PRINCIPAL_ID") or "").strip().lower()
    if text and not coverage.GUID.match(text):
        raise SettingsError(f"COVERAGE_PRINCIPAL_ID must be central's identity's principal (object) id, "
                            f"a GUID (infra sets it), got {text!r}")
    return text


def _arm_api_version(settings: Mapping[str, str]) -> str:
    text = (settings.get("ARM_API_VERSION") or "").strip() or DEFAULT_API_VERSION
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}(-preview)?", text):
        raise SettingsError(f"ARM_API_VERSION must look like 2025-11-01 (or 2025-10-01-preview), "
                            f"got {text!r}")
    return text


def arm_credential(settings: Mapping[str, str], prefix: str = STORAGE_PREFIX) -> Any:
    """The Function app's identity for ARM: the same one as its storage connection (P__credential,
    P__clientId), whatever form the storage connection takes."""
    return _credential(settings, prefix)


def _credential(settings: Mapping[str, str], prefix: str) -> Any:
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    kind = (settings.get(f"{prefix}__credential") or "").strip().lower()
    client_id = (settings.get(f"{prefix}__clientId") or "").strip() or None
    if kind == "managedidentity":
        return ManagedIdentityCredential(client_id=client_id)
    if kind:
        raise SettingsError(f"{prefix}__credential must be 'managedidentity' or empty, got {kind!r}")
    return DefaultAzureCredential(managed_identity_client_id=client_id)


def storage_clients(
    settings: Mapping[str, str], prefix: str = STORAGE_PREFIX, transport: Optional[CountingTransport] = None,
    clock: Optional[ServerClock] = None,
) -> Tuple[Any, Any]:
    """(TableServiceClient, QueueServiceClient) for connection prefix `prefix`; `clock` sees every response's
    Date (central.store.server_clock)."""
    from azure.data.tables import TableServiceClient
    from azure.storage.queue import ExponentialRetry, QueueServiceClient

    extra: Dict[str, Any] = {"transport": transport} if transport is not None else {}
    if clock is not None:
        extra["raw_response_hook"] = clock.observe
    # A short SDK retry for approval sends: the default (15 s backoff, 3 retries) held the service lock
    # ~80 s per approval while the queue service was down; a failed send gives its claim back and the
    # timer retries it, so one quick retry is enough.
    quick = ExponentialRetry(initial_backoff=1, increment_base=3, retry_total=1)
    queue_extra: Dict[str, Any] = {**extra, "retry_policy": quick}
    conn = (settings.get(prefix) or "").strip()
    if conn:
        return (
            TableServiceClient.from_connection_string(conn, **extra),
            QueueServiceClient.from_connection_string(conn, **queue_extra),
        )
    table_uri = (settings.get(f"{prefix}__tableServiceUri") or "").strip()
    queue_uri = (settings.get(f"{prefix}__queueServiceUri") or "").strip()
    if not table_uri or not queue_uri:
        raise SettingsError(
            f"storage connection {prefix!r} is not configured: set {prefix} "
            "(a connection string, e.g. Azurite) "
            f"or both {prefix}__tableServiceUri and {prefix}__queueServiceUri (identity-based)"
        )
    credential = _credential(settings, prefix)
    return (
        TableServiceClient(endpoint=table_uri, credential=credential, **extra),
        QueueServiceClient(account_url=queue_uri, credential=credential, **queue_extra),
    )


def _public_url(s: Mapping[str, str]) -> str:
    """APP_PUBLIC_URL: the app's https base URL (http only on loopback, for the sandbox), or empty."""
    url = (s.get("APP_PUBLIC_URL") or "").strip().rstrip("/")
    parts = urlsplit(url)
    loopback = parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost")
    bad = not parts.netloc or not (parts.scheme == "https" or loopback) or parts.query or parts.fragment
    if url and bad:
        raise SettingsError(f"APP_PUBLIC_URL must be the app's base URL, https://<host> (got {url!r})")
    return url
