"""The VM's managed identity: tokens from the IMDS token endpoint over the standard library's http.client.

The contract is Azure's documented one ("How to use managed identities for Azure resources on an Azure
VM to acquire an access token", REST section): `GET http://169.254.169.254/metadata/identity/oauth2/token
?api-version=2018-02-01&resource=<resource>[&client_id=<id>]` with `Metadata: true`, never through a
proxy; the answer is JSON with `access_token`, `expires_in` and `expires_on` (seconds, as strings), and
404/410/429/5xx are transient (the docs' retry guidance: exponential backoff; 410 while IMDS updates, for
up to 70 s). It replaces MSAL's ManagedIdentityClient, with requests and urllib3 under it, which the
forwarder ran for exactly this one GET: 2.9 MiB of RSS and 8 packages on every VM (docs/forwarder.md,
"Footprint").

What it keeps from there: one token per resource is cached and reused until half its life is gone
(MSAL's and azure-identity's `refresh_in`), then refreshed; a refresh that fails while the cached
token is still valid for REFRESH_MARGIN returns the cached one (the service would take it); every request
takes a slot of the VM's one IMDS budget (5 requests/s, `RateLimiter`), is bounded by a timeout and
never follows a redirect (http.client never does, and never reads proxy settings).
`AZURE_POD_IDENTITY_AUTHORITY_HOST` (the variable azure-identity and MSAL honour) points it at another
IMDS, e.g. the sandbox's.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

from .backoff import Backoff
from .imds_http import Answer, BodyTooLarge, ImdsHttp, TransportError
from .ratelimit import RateLimiter

RETRY_STATUSES = frozenset({404, 410, 429, 500, 502, 503, 504})
ATTEMPTS = 5          # as azure-identity's ImdsCredential (retry_total 5)
RETRY_AFTER_LONGEST = 30.0  # seconds: a longer Retry-After from the token endpoint is believed up to this
TIMEOUT = (3.0, 10.0)  # connect, read (seconds)
MAX_BODY = 64 * 1024   # a token answer is ~2 KB
API_VERSION = "2018-02-01"
TOKEN_PATH = "/metadata/identity/oauth2/token"  # noqa: S105 - a URL path, not a secret
DEFAULT_HOST = "http://169.254.169.254"
AUTHORITY_ENV = "AZURE_POD_IDENTITY_AUTHORITY_HOST"
REFRESH_MARGIN = 300  # seconds: a cached token closer than this to expiry is never handed out


class TokenUnavailable(Exception):
    """No token from IMDS. What to do: check the VM has a managed identity (system-assigned, or the
    user-assigned one named by client_id) and that it holds the role the target service needs."""


class AccessToken(NamedTuple):
    """As azure-core's AccessToken (token, expires_on in epoch seconds), so its clients accept it too."""

    token: str
    expires_on: int


def resource_of(scope: str) -> str:
    return scope[: -len("/.default")] if scope.endswith("/.default") else scope


def parse_token(answer_text: str, now: float) -> Tuple[AccessToken, float]:
    """(the token, when to refresh it) from IMDS's JSON answer; ValueError when it is not one."""
    doc = json.loads(answer_text)
    token = doc.get("access_token") if isinstance(doc, dict) else None
    if not isinstance(token, str) or not token:
        raise ValueError("no access_token in the answer")
    if doc.get("expires_on"):
        expires_on = int(float(doc["expires_on"]))
    else:
        expires_on = int(now) + int(float(doc.get("expires_in") or 0))
    lifetime = max(0.0, expires_on - now)
    return AccessToken(token, expires_on), now + lifetime / 2


def retry_after(answer: Answer) -> Optional[float]:
    """Retry-After in seconds (delta form; IMDS and Azure services send that), or None."""
    value = {k.lower(): v for k, v in answer.headers.items()}.get("retry-after", "").strip()
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class ManagedIdentityCredential:
    """`get_token(scope)` for the forwarder's REST clients (and any azure-core client): one scope per call."""

    def __init__(self, client_id: str, limiter: RateLimiter, stop: Optional[threading.Event] = None,
                 authority: Optional[str] = None, clock: Callable[[], float] = time.time) -> None:
        self.client_id = client_id
        self.limiter = limiter
        self.stop = stop
        self.clock = clock
        self.http = ImdsHttp(authority or os.environ.get(AUTHORITY_ENV) or DEFAULT_HOST)
        self.requests = 0
        self._cache: Dict[str, Tuple[AccessToken, float]] = {}
        self._lock = threading.Lock()  # the sink's and the queue reader's threads share one cache

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        if len(scopes) != 1:
            raise ValueError(f"a managed identity token is for one scope, got {list(scopes)}")
        resource = resource_of(str(scopes[0]))
        with self._lock:
            now = self.clock()
            cached = self._cache.get(resource)
            if cached is not None and now < cached[1]:
                return cached[0]
            try:
                token, refresh_at = self._request(resource)
            except TokenUnavailable:
                if cached is not None and cached[0].expires_on - now > REFRESH_MARGIN:
                    return cached[0]  # refresh failed; the token in hand is still good for a while
                raise
            self._cache[resource] = (token, refresh_at)
            return token

    def forget(self, scope: str) -> None:
        """Drop the cached token for `scope` (a service refused it): the next get_token asks IMDS."""
        with self._lock:
            self._cache.pop(resource_of(scope), None)

    def _request(self, resource: str) -> Tuple[AccessToken, float]:
        query = {"api-version": API_VERSION, "resource": resource}
        if self.client_id:
            query["client_id"] = self.client_id
        backoff = Backoff(base=0.5, cap=8.0)
        problem = ""
        for attempt in range(1, ATTEMPTS + 1):
            slot = self.limiter.acquire(timeout=30.0, stop=self.stop)
            self.requests += 1
            answer: Optional[Answer] = None
            try:
                answer = self.http.exchange("GET", TOKEN_PATH, query, {"Metadata": "true"}, None,
                                            TIMEOUT[0], TIMEOUT[1], MAX_BODY)
            except (TransportError, BodyTooLarge) as exc:
                problem = f"IMDS did not answer ({exc})"
            finally:
                self.limiter.answered(slot)
            if answer is not None:
                if answer.status == 200:
                    try:
                        return parse_token(answer.text, self.clock())
                    except (ValueError, TypeError) as exc:
                        raise TokenUnavailable(f"managed identity token for {resource}: IMDS answered "
                                               f"200 without a token ({exc})") from exc
                problem = _refusal(answer)
                if answer.status not in RETRY_STATUSES:
                    break
            if attempt == ATTEMPTS:
                break
            # Retry-After (429 from IMDS's throttle) is honoured up to 30 s; else jittered backoff.
            delay = backoff.delay_after(retry_after(answer) if answer else None, RETRY_AFTER_LONGEST)
            if self.stop is not None and self.stop.wait(delay):
                break
            if self.stop is None:
                time.sleep(delay)
        raise TokenUnavailable(f"managed identity token for {resource} refused: {problem}; check the "
                               "VM's identity (client_id) and its role assignments")

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ManagedIdentityCredential:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _refusal(answer: Answer) -> str:
    try:
        doc = json.loads(answer.text)
        detail = f"{doc.get('error')}: {doc.get('error_description')}" if isinstance(doc, dict) else ""
    except ValueError:
        detail = ""
    return f"HTTP {answer.status} {(detail or answer.text)[:300].strip()}"
