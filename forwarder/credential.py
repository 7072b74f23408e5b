"""The VM's managed identity as an `azure.core` TokenCredential, for the Event Hubs and Storage queue SDKs.

Tokens come from IMDS (`/metadata/identity/oauth2/token`) through MSAL's `ManagedIdentityClient`: the
same client azure-identity's `ManagedIdentityCredential` runs on a VM (its `ImdsCredential` is an
`MsalManagedIdentityClient`), including MSAL's token cache and its refresh at half-life. It is used
directly because `import azure.identity` loads every credential type the package has (certificate
credentials pull `cryptography.x509`, interactive ones an HTTP server): +11.8 MB of RSS on the pinned
VM install, a quarter of the forwarder's budget, for code a VM never runs (docs/forwarder.md,
"Footprint").

What this module adds around MSAL, as azure-identity does: every token request takes a slot of the
VM's one IMDS budget (5 requests/s, `RateLimiter`), never goes through a proxy, never follows a
redirect, is bounded by a timeout, and is retried on 404/410/429/5xx (the managed-identity docs'
transient answers) with backoff; a cache hit costs no IMDS request at all.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, Optional

from azure.core.exceptions import ClientAuthenticationError

from .backoff import Backoff
from .noproxy import no_proxy_session
from .ratelimit import RateLimiter

RETRY_STATUSES = frozenset({404, 410, 429, 500, 502, 503, 504})
ATTEMPTS = 5          # as azure-identity's ImdsCredential (retry_total 5)
TIMEOUT = (3.0, 10.0)  # connect, read (seconds)


class TokenUnavailable(ClientAuthenticationError):
    """No token from IMDS. What to do: check the VM has a managed identity (system-assigned, or the
    user-assigned one named by client_id) and that it holds the role the target service needs."""


class ImdsTokenHttp:
    """The `http_client` MSAL calls for the token: requests, inside the IMDS budget, bounded, retried."""

    def __init__(self, limiter: RateLimiter, stop: Optional[threading.Event] = None) -> None:
        self.limiter = limiter
        self.stop = stop
        self.session = no_proxy_session()
        self.requests = 0

    def get(self, url: str, params: Any = None, headers: Any = None, **_: Any) -> Any:
        backoff = Backoff(base=0.5, cap=8.0)
        for attempt in range(1, ATTEMPTS + 1):
            self.limiter.acquire(timeout=30.0, stop=self.stop)
            self.requests += 1
            resp = self.session.get(url, params=params, headers=headers, timeout=TIMEOUT,
                                    allow_redirects=False)
            if resp.status_code not in RETRY_STATUSES or attempt == ATTEMPTS:
                return resp
            delay = backoff.next_delay()
            if self.stop is not None and self.stop.wait(delay):
                return resp
            if self.stop is None:
                time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def post(self, url: str, **kwargs: Any) -> Any:  # MSAL's interface; IMDS tokens are GETs
        raise NotImplementedError("IMDS tokens are requested with GET")

    def close(self) -> None:
        self.session.close()


class ManagedIdentityCredential:
    """`get_token(scope)` / `get_token_info(scope)` for azure-core clients (one scope per call)."""

    def __init__(self, client_id: str, limiter: RateLimiter, stop: Optional[threading.Event] = None) -> None:
        import msal

        identity = (msal.UserAssignedManagedIdentity(client_id=client_id) if client_id
                    else msal.SystemAssignedManagedIdentity())
        self.http = ImdsTokenHttp(limiter, stop)
        self._client = msal.ManagedIdentityClient(identity, http_client=self.http,
                                                  token_cache=msal.TokenCache())
        self._lock = threading.Lock()  # the sink's and the queue reader's threads share one cache

    def _acquire(self, scopes: Any) -> Dict[str, Any]:
        if len(scopes) != 1:
            raise ValueError(f"a managed identity token is for one scope, got {list(scopes)}")
        scope = str(scopes[0])
        resource = scope[: -len("/.default")] if scope.endswith("/.default") else scope
        with self._lock:
            try:
                result = self._client.acquire_token_for_client(resource=resource)
            except Exception as exc:
                raise TokenUnavailable(f"managed identity token for {resource}: IMDS did not answer "
                                       f"({type(exc).__name__}: {str(exc)[:200]})") from exc
        if "access_token" not in result:
            raise TokenUnavailable(f"managed identity token for {resource} refused: "
                                   f"{result.get('error')}: {str(result.get('error_description'))[:300]}; "
                                   "check the VM's identity (client_id) and its role assignments")
        return result

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        result = self._acquire(scopes)
        return AccessToken(result["access_token"], int(time.time()) + int(result.get("expires_in", 0)))

    def get_token_info(self, *scopes: str, options: Optional[Dict[str, Any]] = None) -> Any:
        from azure.core.credentials import AccessTokenInfo

        result = self._acquire(scopes)
        now = int(time.time())
        return AccessTokenInfo(result["access_token"], now + int(result.get("expires_in", 0)),
                               token_type=str(result.get("token_type", "Bearer")),
                               refresh_on=result.get("refresh_on"))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ManagedIdentityCredential:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
