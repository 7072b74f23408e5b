"""A local test issuer of Entra-style access tokens for the runner's App Service authentication.

It stands in for Microsoft Entra ID: an RSA key pair (cryptography) in a directory, tokens signed with
PyJWT (RS256) carrying the claims the operator API reads (oid, preferred_username, name, roles) plus aud,
iss, tid, iat, exp. The runner trusts it through the settings file's "Auth" section (`auth_section`).

    python -m sandbox.functions.issuer DIR init
    python -m sandbox.functions.issuer DIR token --name alice@contoso.com --role Operator
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

ISSUER = "https://sts.sandbox.invalid/00000000-0000-0000-0000-000000000001/"
AUDIENCE = "api://se-operator-api-sandbox"
TENANT = "00000000-0000-0000-0000-000000000001"
# as infra/main.bicep excludes them (the console's files hold no data; its calls carry the person's token)
EXCLUDED_PATHS = ["/api/health", "/api/automation/*", "/api/console", "/api/console/*"]


class LocalIssuer:
    def __init__(self, directory: Path, issuer: str = ISSUER, audience: str = AUDIENCE) -> None:
        self.directory = Path(directory).resolve()  # the settings file names its key file by this path
        self.issuer, self.audience = issuer, audience
        self.private_file = self.directory / "issuer-private.pem"
        self.public_file = self.directory / "issuer-public.pem"
        self.jwks_file = self.directory / "issuer-jwks.json"

    def init(self) -> LocalIssuer:
        """A key pair, made once per directory (private key readable by the owner only)."""
        if not self.private_file.exists():
            self.directory.mkdir(parents=True, exist_ok=True)
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.private_file.write_bytes(key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
            self.private_file.chmod(0o600)
            self.public_file.write_bytes(key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
            # The keys document as Entra publishes it (discovery/v2.0/keys), for central's own validation.
            jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
            jwk.update({"kid": self.kid, "use": "sig", "alg": "RS256"})
            self.jwks_file.write_text(json.dumps({"keys": [jwk]}))
        return self

    @property
    def kid(self) -> str:
        return hashlib.sha256(self.public_file.read_bytes()).hexdigest()[:16]

    def app_settings(self) -> Dict[str, str]:
        """The app settings that make central validate this issuer's tokens itself (as infra sets them for
        the tenant): OPERATOR_API_AUDIENCE, OPERATOR_API_ISSUERS, OPERATOR_API_JWKS_URL (a file: URL)."""
        return {"OPERATOR_API_AUDIENCE": self.audience, "OPERATOR_API_ISSUERS": self.issuer,
                "OPERATOR_API_JWKS_URL": self.jwks_file.resolve().as_uri()}

    def auth_section(self, enabled: bool = True) -> Dict[str, Any]:
        """The runner settings file's "Auth" section that trusts this issuer."""
        return {"enabled": enabled, "issuer": self.issuer, "audience": self.audience,
                "publicKeyFile": str(self.public_file), "excludedPaths": list(EXCLUDED_PATHS)}

    def token(self, name: str, roles: Sequence[str] = (), object_id: Optional[str] = None,
              lifetime: int = 3600, audience: Optional[str] = None, **extra: Any) -> str:
        now = int(time.time())
        claims: Dict[str, Any] = {
            "aud": audience or self.audience, "iss": self.issuer, "tid": TENANT, "iat": now, "nbf": now,
            "exp": now + lifetime, "oid": object_id or str(uuid.uuid5(uuid.NAMESPACE_URL, name)),
            "preferred_username": name, "name": name.split("@")[0].title(), "ver": "2.0",
        }
        if roles:
            claims["roles"] = list(roles)
        claims.update(extra)
        return jwt.encode(claims, self.private_file.read_bytes(), algorithm="RS256",
                          headers={"kid": self.kid})


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.functions.issuer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="make the key pair")
    token = sub.add_parser("token", help="print a signed access token")
    token.add_argument("--name", required=True)
    token.add_argument("--role", action="append", default=[], help="Operator or Reader (repeatable)")
    token.add_argument("--object-id")
    args = parser.parse_args(argv)
    issuer = LocalIssuer(args.directory).init()
    if args.command == "token":
        print(issuer.token(args.name, args.role, args.object_id))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
