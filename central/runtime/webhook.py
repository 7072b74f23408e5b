"""Alerts through a webhook (requests): generic JSON, Microsoft Teams (MessageCard) or Slack.

Alerts are delivered at least once (central.runtime.act keeps them in the State table until delivered): every
POST carries a stable idempotency key (header and body) so a receiver can drop a repeat.
Delivery is bounded: `max_attempts` tries with exponential backoff (base, 2x base, 4x base...),
each with a short timeout. Sending never raises: the outcome (sent / failed, attempts, last error)
is returned so the caller records it. After a failure, later alerts of the same call are not tried
at all (the endpoint is down; do not stall the batch alert after alert): the service keeps them and
its timer retries them.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import quote, urlsplit

import requests

from central.model.alert import Alert, Delivery
from central.model.times import iso

log = logging.getLogger("central.alerts")  # stable: docs and queries select on it

FORMATS = ("generic", "teams", "slack")
IDEMPOTENCY_HEADER = "Idempotency-Key"  # the same value as the body's key (IETF draft header name)
COLORS = {"info": "2E7D32", "warning": "F9A825", "critical": "C62828"}


def idempotency_key(alert: Alert) -> str:
    """Stable across every retry, instance and restart: a receiver drops a repeat by it."""
    return "se-" + hashlib.sha256(alert.key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def console_link(alert: Alert, public_url: str) -> Optional[str]:
    """The event's page in the on-call console (APP_PUBLIC_URL), or None (no URL set, or no event)."""
    if not public_url or not alert.event_id:
        return None
    return f"{public_url.rstrip('/')}/api/console/#event={quote(alert.event_id, safe='')}"


def payload(alert: Alert, fmt: str, public_url: str = "") -> Dict[str, Any]:
    """The webhook body for `fmt` (each carries the idempotency key: generic `idempotencyKey`,
    Teams/Slack as a fact, since their schemas have no free field), and the event's console link:
    generic `link`; a Teams and a Slack button."""
    link = console_link(alert, public_url)
    facts = {k: ("" if v is None else str(v)) for k, v in alert.facts.items()}
    if fmt != "generic":
        facts["idempotencyKey"] = idempotency_key(alert)
    if fmt == "teams":
        return {
            "@type": "MessageCard",
            "@context": "https://schema.org/extensions",
            "summary": alert.title[:200],
            "themeColor": COLORS.get(alert.severity, "607D8B"),
            "title": alert.title,
            "text": alert.text,
            "sections": [{"facts": [{"name": k, "value": v} for k, v in facts.items()]}],
            **({"potentialAction": [{"@type": "OpenUri", "name": "Open in the console",
                                     "targets": [{"os": "default", "uri": link}]}]} if link else {}),
        }
    if fmt == "slack":
        fields = [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in list(facts.items())[:10]]
        blocks: List[Dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": alert.title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": alert.text[:3000]}},
        ]
        if fields:
            blocks.append({"type": "section", "fields": fields})
        if link:
            blocks.append({"type": "actions", "elements": [{
                "type": "button", "text": {"type": "plain_text", "text": "Open in the console"},
                "url": link}]})
        return {"text": f"[{alert.severity}] {alert.title}", "blocks": blocks}
    return {
        "schemaVersion": 1,
        "key": alert.key,
        "idempotencyKey": idempotency_key(alert),
        "kind": alert.kind,
        "severity": alert.severity,
        "title": alert.title,
        "text": alert.text,
        "eventId": alert.event_id,
        "status": alert.status,
        "at": iso(alert.at),
        "facts": alert.facts,
        "link": link,
    }


@dataclass
class WebhookAlerter:
    url: str = ""
    fmt: str = "generic"
    public_url: str = ""  # APP_PUBLIC_URL: alerts link to the event's console page
    max_attempts: int = 3
    backoff: float = 0.5
    timeout: float = 5.0
    session: requests.Session = field(default_factory=requests.Session)
    sleep: Callable[[float], None] = time.sleep
    _degraded: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"ALERT_WEBHOOK_FORMAT must be one of {', '.join(FORMATS)}, not {self.fmt!r}")

    def new_batch(self) -> None:
        self._degraded = False

    def send(self, alert: Alert) -> Delivery:
        if not self.url:
            log.warning("alert (no webhook configured): %s: %s", alert.title, alert.text)
            # the default: the alert is delivered to the log (this line, and its Alerts row), not failed
            return Delivery(False, 0, logged=True)
        if self._degraded:
            # the endpoint already failed in this call: do not stall the batch alert after alert
            return Delivery(
                False, 0, "not tried: the webhook failed earlier in this call (the timer retries)"
            )
        attempts = max(1, self.max_attempts)
        body = payload(alert, self.fmt, self.public_url)
        error = ""
        status: Optional[int] = None
        for attempt in range(1, attempts + 1):
            try:
                resp = self.session.post(self.url, json=body, timeout=self.timeout, allow_redirects=False,
                                         headers={IDEMPOTENCY_HEADER: idempotency_key(alert)})
                status = resp.status_code
                if 200 <= resp.status_code < 300:
                    return Delivery(True, attempt, http_status=status)
                error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
                    break  # the endpoint rejects this body; retrying sends the same body
            except requests.RequestException as exc:
                # not str(exc): requests puts the whole URL in it, and a webhook URL's path and query are
                # its secret (Teams, Slack); this text goes to the log and the Alerts rows
                error = f"{type(exc).__name__} posting to {_host(self.url)}"
            if attempt < attempts:
                self.sleep(self.backoff * (2 ** (attempt - 1)))
        self._degraded = True
        log.error("alert %s failed after %d attempt(s): %s", alert.key, attempts, error)
        return Delivery(False, attempts, error, status)


def _host(url: str) -> str:
    """The URL's scheme and host: what a message may say of a webhook URL."""
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.hostname or '?'}" + (f":{parts.port}" if parts.port else "")
    except ValueError:  # (a port that is no number)
        return "the webhook"
