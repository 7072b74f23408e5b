"""The sandbox services' Bearer token check, as Azure's front doors make it before anything else: a JWT
whose audience is the service's and which has not expired ('' when usable, else the 401's detail).

One rule for the ARM stand-in, the Resource Graph stand-ins and the Event Hubs REST front. The signature
is not checked: the IMDS simulator's managed-identity tokens are unsigned (sandbox/imds/metadata.py)."""

from __future__ import annotations

import base64
import json
import time
from typing import Optional, Sequence


def bearer_problem(authorization: str, audiences: Sequence[str], service: str,
                   now: Optional[float] = None) -> str:
    """'' when `authorization` carries a Bearer JWT for one of `audiences` (a trailing slash and case
    aside) that has not expired at `now` (default: the clock), else why not."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or token.count(".") != 2:
        return "a Bearer token is required"
    try:
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "==="))
    except ValueError:
        return "the Bearer token is not a JWT"
    if not isinstance(claims, dict):
        return "the Bearer token is not a JWT"
    wanted = {a.rstrip("/").lower() for a in audiences}
    if str(claims.get("aud", "")).rstrip("/").lower() not in wanted:
        return f"InvalidAudience: the token's audience {claims.get('aud')!r} is not {service}'s"
    expires = claims.get("exp")
    if not isinstance(expires, (int, float)) or expires <= (time.time() if now is None else now):
        return "ExpiredToken: the token has expired"
    return ""
