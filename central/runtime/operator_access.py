"""Who is calling the operator API, and may they: functions over the request's headers and settings
(pure but for entra_tokens.py's fetch of the tenant's signing keys).

Two kinds of caller (docs/security.md, "Operators"):
- a person (or a service principal) signed in with Entra ID. With OPERATOR_API_AUDIENCE set (infra sets
  it) central validates the bearer token itself (entra_tokens.py) and reads no principal header.
  Otherwise App Service authentication validates the token in front of the app and passes the principal
  as `X-MS-CLIENT-PRINCIPAL` (base64 JSON); that header is believed only when the platform's
  authentication is on for this app (`WEBSITE_AUTH_ENABLED`, the Functions host's own test): then the
  platform strips client-sent copies; otherwise anyone could send one, so it is never read. Roles come
  from the token's app roles: `Operator` decides (approve, hold, release), `Reader` reads (pending, one
  event, fleet); an Operator may read too.
- a machine holding a named function key (a paging bot, a runbook), on the automation route only. The
  host has checked the key; the Python worker is not told which key matched, so central names it: the
  SHA-256 of the presented `x-functions-key` must be registered under a name in OPERATOR_KEY_SHA256.
  A key not registered there (the default key, the master key) decides nothing.

Who decided is recorded from these, never from the request body: `operator:<name> (<object id>)` or
`key:<name>`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Mapping, Optional, Union

PRINCIPAL_HEADER = "x-ms-client-principal"
KEY_HEADER = "x-functions-key"
OPERATOR_ROLE, READER_ROLE = "Operator", "Reader"
READ, DECIDE = "read", "decide"
ROLES_FOR = {READ: frozenset({READER_ROLE, OPERATOR_ROLE}), DECIDE: frozenset({OPERATOR_ROLE})}
MAX_PRINCIPAL = 16 * 1024  # bytes of the base64 header decoded at most (a token's claims are a few KB)
# Claim types as App Service authentication writes them for the Microsoft identity platform.
OBJECT_ID_CLAIMS = ("http://schemas.microsoft.com/identity/claims/objectidentifier", "oid")
# A sign-in name (UPN) before a display name: two people may share "Alice Smith", not alice@contoso.com.
NAME_CLAIMS = ("http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name", "preferred_username",
               "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/upn", "upn", "name")
APP_ID_CLAIMS = ("azp", "appid")  # a service principal's token (client credentials) has no user name
ROLE_CLAIMS = ("roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role")
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Caller:
    """A caller the platform vouched for: kind "user" (a signed-in principal) or "key" (a named key)."""

    kind: str
    name: str
    object_id: str = ""
    roles: FrozenSet[str] = frozenset()

    @property
    def decided_by(self) -> str:
        """What a decision records as who decided (decidedBy, the se.operator marker, the alert)."""
        if self.kind == "key":
            return f"key:{self.name}"
        return f"operator:{self.name} ({self.object_id})"

    def note_from(self, body: Mapping[str, Any]) -> Optional[str]:
        """A body's `operator` field, kept as a note in the reason when it differs from who decided;
        never believed as who decided."""
        claimed = str(body.get("operator") or "").strip()
        if not claimed or claimed == self.name:
            return None
        return f"(body said operator {claimed[:200]!r}; not verified)"


@dataclass(frozen=True)
class Refusal:
    """Why the caller may not: 401 (nobody the platform vouched for) or 403 (vouched for, not allowed)."""

    status: int
    message: str


def auth_enabled(environment: Mapping[str, str]) -> bool:
    """App Service authentication is on for this app: the platform sets WEBSITE_AUTH_ENABLED=True."""
    return str(environment.get("WEBSITE_AUTH_ENABLED", "")).strip().lower() == "true"


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return str(value)
    return ""


def decode_principal(encoded: str) -> Caller:
    """X-MS-CLIENT-PRINCIPAL (base64 JSON {auth_typ, name_typ, role_typ, claims: [{typ, val}]}) as a
    Caller. ValueError when it is not one, or carries no object id."""
    if len(encoded) > MAX_PRINCIPAL:
        raise ValueError("the principal header is too large")
    try:
        document = json.loads(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValueError("the principal header is not base64 JSON") from None
    if not isinstance(document, dict) or not isinstance(document.get("claims"), list):
        raise ValueError("the principal header has no claims")
    claims: Dict[str, list] = {}
    for claim in document["claims"]:
        if isinstance(claim, dict) and all(isinstance(claim.get(k), str) for k in ("typ", "val")):
            claims.setdefault(claim["typ"], []).append(claim["val"])

    def first(types: Any) -> str:
        return next((claims[t][0].strip() for t in types if t in claims and claims[t][0].strip()), "")

    object_id = first(OBJECT_ID_CLAIMS)
    if not object_id:
        raise ValueError("the principal has no object id (oid) claim")
    name_types = tuple(t for t in (document.get("name_typ"),) if isinstance(t, str)) + NAME_CLAIMS
    name = first(name_types) or (f"app:{first(APP_ID_CLAIMS)}" if first(APP_ID_CLAIMS) else object_id)
    role_types = tuple(t for t in (document.get("role_typ"),) if isinstance(t, str)) + ROLE_CLAIMS
    roles = frozenset(v for t in role_types for v in claims.get(t, []))
    return Caller("user", name[:200], object_id[:64], roles)


def signed_in(headers: Mapping[str, str], environment: Mapping[str, str],
              need: str) -> Union[Caller, Refusal]:
    """The signed-in caller of an operator route, if they hold a role that allows `need` (READ, DECIDE):
    from the bearer token validated in the app when OPERATOR_API_AUDIENCE is set (entra_tokens.py; the
    principal headers are then not read), else from the platform's principal."""
    from .entra_tokens import validator_for  # PyJWT and the key cache load only when used

    validator = validator_for(environment)
    if validator is not None:
        claims = validator.claims(_header(headers, "authorization"))
        return _allowed(Refusal(*claims) if isinstance(claims, tuple) else caller_from_claims(claims), need)
    return _allowed(_platform_principal(headers, environment), need)


def caller_from_claims(claims: Mapping[str, Any]) -> Caller:
    """A validated access token's caller: sign-in name (a service principal: app:<client id>), oid, roles."""
    names = ("preferred_username", "upn", "unique_name", "name")
    name = next((str(claims[c]) for c in names if claims.get(c)), "")
    if not name:
        app = next((str(claims[c]) for c in APP_ID_CLAIMS if claims.get(c)), "")
        name = f"app:{app}" if app else str(claims["oid"])
    roles = claims.get("roles") or []
    return Caller("user", name[:200], str(claims["oid"])[:64],
                  frozenset(str(r) for r in (roles if isinstance(roles, list) else [roles])))


def _allowed(caller: Union[Caller, Refusal], need: str) -> Union[Caller, Refusal]:
    if isinstance(caller, Refusal):
        return caller
    allowed = ROLES_FOR[need]
    if not caller.roles & allowed:
        return Refusal(403, f"{caller.name} may not {need}: that needs the app role "
                            f"{' or '.join(sorted(allowed))} on the operator API (docs/security.md)")
    return caller


def _platform_principal(headers: Mapping[str, str], environment: Mapping[str, str]) -> Union[Caller, Refusal]:
    if not auth_enabled(environment):
        return Refusal(401, "App Service authentication is off for this app, so no caller can be believed: "
                            "turn it on (infra/ does; docs/security.md) or use the automation route with "
                            "a named function key")
    encoded = _header(headers, PRINCIPAL_HEADER)
    if not encoded:
        return Refusal(401, "sign in: send an Entra ID access token for the operator API "
                            "(Authorization: Bearer ...; docs/functions.md)")
    try:
        return decode_principal(encoded)
    except ValueError as exc:
        return Refusal(401, f"the platform's principal could not be read ({exc}); sign in again")


def parse_key_names(text: str) -> Dict[str, str]:
    """OPERATOR_KEY_SHA256: a JSON object {"<key name>": "<sha256 hex of the key>"}; empty: none.
    ValueError with what is wrong (the app refuses key decisions rather than guess)."""
    if not text.strip():
        return {}
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"OPERATOR_KEY_SHA256 is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError('OPERATOR_KEY_SHA256 must be a JSON object {"<key name>": "<sha256 hex>"}')
    names: Dict[str, str] = {}
    for name, digest in document.items():
        if not _KEY_NAME.match(str(name)):
            raise ValueError(f"OPERATOR_KEY_SHA256: key name {name!r}: letters, digits, - _ . (64 at most)")
        if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
            raise ValueError(f"OPERATOR_KEY_SHA256: {name}: the value must be the key's SHA-256 "
                             "(64 hex digits)")
        names[str(name)] = digest.lower()
    return names


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def named_key(headers: Mapping[str, str], environment: Mapping[str, str]) -> Union[Caller, Refusal]:
    """The automation route's caller: the name OPERATOR_KEY_SHA256 registers for the function key the host
    accepted. ValueError when that setting is malformed (the app refuses rather than guess)."""
    key_names = parse_key_names(str(environment.get("OPERATOR_KEY_SHA256", "")))
    presented = _header(headers, KEY_HEADER)
    if not presented:
        return Refusal(401, "send the integration's named function key in the x-functions-key header "
                            "(a ?code= key is not named, and ends up in logs)")
    digest = key_digest(presented)
    for name, registered in key_names.items():
        if hmac.compare_digest(digest, registered):
            return Caller("key", name)
    return Refusal(403, "this function key has no name in OPERATOR_KEY_SHA256, so it decides nothing: "
                        "create a named key per integration (docs/functions.md)")
