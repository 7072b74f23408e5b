"""App Service authentication (Easy Auth) as the runner emulates it, in front of the HTTP triggers.

What the platform does, and so this does (docs/functions.md, "Signed-in operators"):
- every client-sent `X-MS-CLIENT-PRINCIPAL*` header is removed, whether authentication is on or off;
- with authentication on (the settings file's "Auth": {"enabled": true, ...}), a request outside the
  excluded paths needs `Authorization: Bearer <token>` signed by the configured issuer for the configured
  audience, or it is answered 401 (Return401: never a redirect); a valid token becomes the principal
  headers the platform sets (`X-MS-CLIENT-PRINCIPAL` base64 JSON, `-ID`, `-NAME`, `-IDP`), and the
  worker's environment has WEBSITE_AUTH_ENABLED=True;
- with it off, nothing is added and WEBSITE_AUTH_ENABLED is absent (a settings file that sets it is
  overridden: only the platform sets it).

Tokens are checked with PyJWT (RS256 only; signature, audience, issuer, expiry). The local test issuer
that signs them is sandbox/functions/issuer.py.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Tuple

import jwt

log = logging.getLogger("sandbox.functions")

PRINCIPAL_PREFIX = "x-ms-client-principal"
# How the platform writes an Entra token's claims into X-MS-CLIENT-PRINCIPAL (the .NET inbound claim map).
NAME_TYPE = "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/name"
ROLE_TYPE = "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"
CLAIM_MAP = {
    "oid": "http://schemas.microsoft.com/identity/claims/objectidentifier",
    "tid": "http://schemas.microsoft.com/identity/claims/tenantid",
    "upn": "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/upn",
    "unique_name": NAME_TYPE,
    "sub": "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/nameidentifier",
}


@dataclass
class EasyAuth:
    enabled: bool = False
    issuer: str = ""
    audiences: List[str] = field(default_factory=list)
    public_key_pem: bytes = b""
    excluded_paths: List[str] = field(default_factory=list)

    @classmethod
    def from_settings(cls, auth: Mapping[str, Any], base: Optional[Path] = None) -> EasyAuth:
        """The settings file's "Auth" section: enabled, issuer, audience (a string or a list),
        publicKeyFile (PEM, relative to the settings file), excludedPaths."""
        if not auth or not auth.get("enabled"):
            return cls()
        missing = [k for k in ("issuer", "audience", "publicKeyFile") if not auth.get(k)]
        if missing:
            raise ValueError(f'the settings file\'s "Auth" section needs {", ".join(missing)} when enabled')
        key_file = Path(str(auth["publicKeyFile"]))
        if not key_file.is_absolute() and base is not None:
            key_file = base / key_file
        try:
            pem = key_file.read_bytes()
        except OSError as exc:
            raise ValueError(f"Auth.publicKeyFile {key_file}: {exc.strerror}") from None
        audience = auth["audience"]
        return cls(True, str(auth["issuer"]), [audience] if isinstance(audience, str) else list(audience),
                   pem, [str(p) for p in auth.get("excludedPaths") or []])

    @classmethod
    def for_settings(cls, source: Optional[Path]) -> EasyAuth:
        """From the "Auth" section of the runner's settings file (off when there is none)."""
        if source is None:
            return cls()
        document = json.loads(Path(source).read_text(encoding="utf-8"))
        return cls.from_settings(document.get("Auth") or {}, Path(source).resolve().parent)

    def environment(self, values: MutableMapping[str, str]) -> None:
        """WEBSITE_AUTH_ENABLED as the platform sets it: True when on, absent when off."""
        values.pop("WEBSITE_AUTH_ENABLED", None)
        if self.enabled:
            values["WEBSITE_AUTH_ENABLED"] = "True"

    def excluded(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, pattern) or path == pattern.rstrip("/*")
                   for pattern in self.excluded_paths)

    def filter(self, path: str, headers: Dict[str, str]) -> Tuple[Optional[str], Dict[str, str]]:
        """(why the request is refused with 401, or None; the headers the worker sees)."""
        kept = {k: v for k, v in headers.items() if not k.lower().startswith(PRINCIPAL_PREFIX)}
        if len(kept) != len(headers):
            log.info("easyauth: dropped client-sent %s headers on %s", PRINCIPAL_PREFIX, path)
        if not self.enabled or self.excluded(path):
            return None, kept
        authorization = next((v for k, v in kept.items() if k.lower() == "authorization"), "")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "no bearer token", kept
        try:
            claims = jwt.decode(token.strip(), self.public_key_pem, algorithms=["RS256"],
                                audience=self.audiences, issuer=self.issuer,
                                options={"require": ["exp", "iss", "aud", "oid"]})
        except jwt.InvalidTokenError as exc:
            return f"invalid token: {exc}", kept
        kept.update(principal_headers(claims))
        return None, kept


def principal_headers(claims: Mapping[str, Any]) -> Dict[str, str]:
    """The headers the platform sets for a validated Entra token."""
    listed = []
    for name, value in claims.items():
        for one in value if isinstance(value, list) else [value]:
            listed.append({"typ": CLAIM_MAP.get(name, name), "val": str(one)})
    document = {"auth_typ": "aad", "claims": listed, "name_typ": NAME_TYPE, "role_typ": ROLE_TYPE}
    name = str(claims.get("unique_name") or claims.get("preferred_username") or claims.get("upn") or "")
    return {
        "X-MS-CLIENT-PRINCIPAL": base64.b64encode(json.dumps(document).encode()).decode(),
        "X-MS-CLIENT-PRINCIPAL-ID": str(claims.get("oid", "")),
        "X-MS-CLIENT-PRINCIPAL-NAME": name,
        "X-MS-CLIENT-PRINCIPAL-IDP": "aad",
    }
