"""The operator API's Entra ID access tokens, validated in the app (PyJWT: signature against the tenant's
published signing keys, audience, issuer, expiry, RS256 only).

Why in the app as well as App Service authentication: Microsoft's Flex Consumption documentation has said
that App Service authentication is not supported there and that "unauthenticated callers currently
aren't blocked when EasyAuth is enabled in a Flex Consumption plan app" (docs/security.md, "Operators").
So when OPERATOR_API_AUDIENCE is set (infra sets it) central never relies on the platform: it validates
the bearer token itself and takes the caller from the validated claims; principal headers are then not
read at all. Without it, central falls back to the platform's principal (only with WEBSITE_AUTH_ENABLED).

Settings: OPERATOR_API_AUDIENCE (api://<client id>; the bare client id is accepted too),
OPERATOR_API_ISSUERS (comma-separated: the tenant's v1 and v2 issuers), OPERATOR_API_JWKS_URL (the
tenant's signing keys; PyJWKClient caches them and refetches on an unknown key id, so rotation works).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union
from urllib.parse import urlsplit
from urllib.request import url2pathname

import jwt

_cache: Dict[Tuple[str, str, str], TokenValidator] = {}
_lock = threading.Lock()


class TokenValidator:
    def __init__(self, audience: str, issuers: str, jwks_url: str) -> None:
        self.audiences = [audience] + ([audience[len("api://"):]] if audience.startswith("api://") else [])
        self.issuers = [i.strip() for i in issuers.split(",") if i.strip()]
        if not self.issuers or not jwks_url:
            raise ValueError("OPERATOR_API_AUDIENCE is set: OPERATOR_API_ISSUERS and OPERATOR_API_JWKS_URL "
                             "must be set too (infra/app/function.bicep sets all three)")
        # https: Entra's keys endpoint; file: a local test issuer's keys (sandbox/functions/issuer.py).
        self.keys = _FileKeys(jwks_url) if jwks_url.startswith("file:") else jwt.PyJWKClient(
            jwks_url, cache_keys=True, lifespan=3600, timeout=10)

    def claims(self, authorization: str) -> Union[Dict[str, Any], Tuple[int, str]]:
        """The validated token's claims, or (status, why) when there is no valid token."""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return 401, ("sign in: send an Entra ID access token for the operator API "
                         "(Authorization: Bearer ...; docs/functions.md)")
        try:
            key = self.keys.get_signing_key_from_jwt(token.strip())
            return jwt.decode(token.strip(), key.key, algorithms=["RS256"], audience=self.audiences,
                              issuer=self.issuers, options={"require": ["exp", "iss", "aud", "oid"]})
        except jwt.PyJWKClientConnectionError as exc:  # the keys cannot be fetched: not the caller's fault
            return 503, f"the operator API's signing keys cannot be fetched now ({exc}); try again"
        except (jwt.InvalidTokenError, jwt.PyJWKClientError) as exc:
            return 401, f"the token is not valid for the operator API ({exc}); sign in again"


class _FileKeys:
    """PyJWKClient's one call, over a keys document on disk (read on each call: it is small and local)."""

    def __init__(self, url: str) -> None:
        self.path = Path(url2pathname(urlsplit(url).path))

    def get_signing_key_from_jwt(self, token: str) -> jwt.PyJWK:
        kid = jwt.get_unverified_header(token).get("kid")
        try:
            keys = jwt.PyJWKSet.from_json(self.path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise jwt.PyJWKClientConnectionError(f"{self.path}: {exc.strerror}") from None
        for key in keys.keys:
            if key.key_id == kid:
                return key
        raise jwt.PyJWKClientError(f"no signing key {kid!r} in {self.path}")


def validator_for(environment: Mapping[str, str]) -> Optional[TokenValidator]:
    """The in-app validator when OPERATOR_API_AUDIENCE is set (one per worker: its key cache is shared)."""
    audience = str(environment.get("OPERATOR_API_AUDIENCE", "")).strip()
    if not audience:
        return None
    settings = (audience, str(environment.get("OPERATOR_API_ISSUERS", "")),
                str(environment.get("OPERATOR_API_JWKS_URL", "")).strip())
    with _lock:
        if settings not in _cache:
            _cache[settings] = TokenValidator(*settings)
        return _cache[settings]
