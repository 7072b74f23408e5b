"""The local issuer's sign-in endpoints, shaped like Microsoft Entra ID's v2.0 endpoints, so the operator
console's @azure/msal-browser signs in here exactly as it does against Entra (auth code flow with PKCE).

    python -m sandbox.functions.signin DIR --port 8443 [--redirect-uri http://127.0.0.1/api/console/]

Served over HTTPS (MSAL refuses an http authority) with a self-signed certificate for 127.0.0.1 kept in
DIR (a browser asks once to accept it). Paths, as Entra's under https://login.microsoftonline.com:
  GET  /{tenant}/v2.0/.well-known/openid-configuration   the discovery document
  GET  /{tenant}/discovery/v2.0/keys                      the signing keys (the same key as `issuer.py`)
  GET  /{tenant}/oauth2/v2.0/authorize                    a login page: pick a test person and role
  POST /{tenant}/oauth2/v2.0/authorize                    the pick: a one-time code back to redirect_uri
  POST /{tenant}/oauth2/v2.0/token                        code + code_verifier (S256) -> access + id token
  GET  /{tenant}/oauth2/v2.0/logout                       back to post_logout_redirect_uri
A redirect URI must be registered (--redirect-uri, repeatable); as Entra does for loopback redirect URIs
of public clients, the port of a 127.0.0.1 / localhost URI is not compared. No refresh token is issued:
when the access token expires, the console asks the person to sign in again.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import html
import ipaddress
import json
import secrets
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from .issuer import TENANT, LocalIssuer

CODE_LIFETIME = 120.0  # seconds a code may wait for its token request (Entra: 10 minutes)
DEFAULT_REDIRECT = "http://127.0.0.1/api/console/"
# The test people, by app role: (sign-in name, object id); sandbox/demo/fleet.py uses the same.
PEOPLE = {"Operator": ("olga.operator@contoso.com", "0c0a4f1e-5d7b-4c55-9a3e-7f2d8e6b1a01"),
          "Reader": ("rita.reader@contoso.com", "9b8e2d44-1f3a-4e6c-8d2b-5a7c9e0f3b02")}


def redirect_allowed(uri: str, registered: Sequence[str]) -> bool:
    """Exact match, except the port of a loopback http URI (Entra ignores it for public clients)."""
    asked = urlsplit(uri)
    for one in registered:
        known = urlsplit(one)
        if uri == one:
            return True
        loopback = asked.hostname in ("127.0.0.1", "localhost") and known.hostname == asked.hostname
        if loopback and (asked.scheme, asked.path, asked.query) == (known.scheme, known.path, known.query):
            return True
    return False


def s256(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()


def _b64url_json(document: Mapping[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()


@dataclass
class Grant:
    client_id: str
    redirect_uri: str
    challenge: str
    nonce: str
    scope: str
    role: str
    expires: float


class SignIn:
    """The endpoints' logic over one LocalIssuer (its key signs both tokens); no HTTP here."""

    def __init__(self, issuer: LocalIssuer, base_url: str, redirect_uris: Sequence[str],
                 lifetime: int = 3600) -> None:
        self.issuer, self.base = issuer, base_url.rstrip("/")
        self.redirect_uris, self.lifetime = list(redirect_uris), lifetime
        self.codes: Dict[str, Grant] = {}
        self._lock = threading.Lock()

    @property
    def authority(self) -> str:
        return f"{self.base}/{TENANT}"

    def discovery(self) -> Dict[str, object]:
        root = f"{self.authority}/oauth2/v2.0"
        return {"issuer": f"{self.authority}/v2.0", "authorization_endpoint": f"{root}/authorize",
                "token_endpoint": f"{root}/token", "end_session_endpoint": f"{root}/logout",
                "jwks_uri": f"{self.authority}/discovery/v2.0/keys", "response_modes_supported": [
                    "query", "fragment", "form_post"], "response_types_supported": ["code"],
                "code_challenge_methods_supported": ["S256"],
                "id_token_signing_alg_values_supported": ["RS256"], "subject_types_supported": ["pairwise"],
                "scopes_supported": ["openid", "profile", "offline_access"]}

    def check_authorize(self, query: Mapping[str, str]) -> Optional[str]:
        """Why an authorize request is refused (shown on the page, never redirected), or None."""
        if not redirect_allowed(query.get("redirect_uri", ""), self.redirect_uris):
            return f"redirect_uri {query.get('redirect_uri')!r} is not registered (AADSTS50011)"
        if query.get("response_type") != "code":
            return "response_type must be code"
        if query.get("code_challenge_method") != "S256" or not query.get("code_challenge"):
            return "PKCE is required: code_challenge with code_challenge_method=S256"
        return None

    def grant(self, query: Mapping[str, str], role: str) -> str:
        """The redirect back to the app with a one-time code for `role`'s test person."""
        if role not in PEOPLE:
            raise ValueError(f"unknown role {role!r}")
        code = secrets.token_urlsafe(32)
        with self._lock:
            self.codes[code] = Grant(query["client_id"], query["redirect_uri"], query["code_challenge"],
                                     query.get("nonce", ""), query.get("scope", ""), role,
                                     time.monotonic() + CODE_LIFETIME)
        return self.answer(query, {"code": code, "client_info": self._client_info(role)})

    def answer(self, query: Mapping[str, str], params: Mapping[str, str]) -> str:
        """redirect_uri with `params` and the request's state, in the response_mode asked for."""
        params = {**params, **({"state": query["state"]} if query.get("state") else {})}
        joiner = "?" if query.get("response_mode") == "query" else "#"
        return f"{query['redirect_uri']}{joiner}{urlencode(params)}"

    def _client_info(self, role: str) -> str:
        return _b64url_json({"uid": PEOPLE[role][1], "utid": TENANT})

    def token(self, form: Mapping[str, str]) -> Tuple[int, Dict[str, object]]:
        """(status, body) of the token endpoint: an authorization_code grant with its PKCE verifier."""
        if form.get("grant_type") != "authorization_code":
            return 400, {"error": "unsupported_grant_type",
                         "error_description": "only authorization_code (no refresh tokens here)"}
        with self._lock:
            grant = self.codes.pop(form.get("code", ""), None)  # one use only
        if grant is None or grant.expires < time.monotonic():
            return 400, {"error": "invalid_grant",
                         "error_description": "the code is unknown, used or expired"}
        if form.get("client_id") != grant.client_id or form.get("redirect_uri") != grant.redirect_uri:
            return 400, {"error": "invalid_grant", "error_description": "client_id or redirect_uri differ"}
        if s256(form.get("code_verifier", "")) != grant.challenge:
            return 400, {"error": "invalid_grant", "error_description": "code_verifier does not match (PKCE)"}
        name, oid = PEOPLE[grant.role]
        api_scopes = [s for s in grant.scope.split() if s not in ("openid", "profile", "offline_access")]
        audience = api_scopes[0].rsplit("/", 1)[0] if api_scopes else self.issuer.audience
        access = self.issuer.token(name, [grant.role], object_id=oid, lifetime=self.lifetime,
                                   audience=audience, azp=grant.client_id)
        now = int(time.time())
        id_claims = {"iss": f"{self.authority}/v2.0", "aud": grant.client_id, "iat": now, "nbf": now,
                     "exp": now + self.lifetime, "sub": str(uuid.uuid5(uuid.NAMESPACE_URL, f"sub:{oid}")),
                     "oid": oid, "tid": TENANT, "preferred_username": name,
                     "name": name.split("@")[0].title(),
                     "ver": "2.0", "roles": [grant.role],
                     **({"nonce": grant.nonce} if grant.nonce else {})}
        id_token = jwt.encode(id_claims, self.issuer.private_file.read_bytes(), algorithm="RS256",
                              headers={"kid": self.issuer.kid})
        return 200, {"token_type": "Bearer", "scope": " ".join(api_scopes) or grant.scope,
                     "expires_in": self.lifetime, "ext_expires_in": self.lifetime, "access_token": access,
                     "id_token": id_token, "client_info": self._client_info(grant.role)}


def login_page(query: Mapping[str, str], refused: Optional[str] = None) -> str:
    """The person picker: one button per test person (no script, every value escaped)."""
    hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                     for k, v in query.items())
    if refused:
        body = f"<p role=\"alert\">This sign-in request is refused: {html.escape(refused)}</p>"
    else:
        buttons = "".join(
            f'<p><button type="submit" name="role" value="{role}">Sign in as {html.escape(name)} '
            f"({role})</button></p>" for role, (name, _) in PEOPLE.items())
        body = f'<form method="post">{hidden}{buttons}</form>'
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width\"><title>Sign in (sandbox issuer)</title>"
            "</head><body><main><h1>Sign in to the operator API (sandbox)</h1>"
            "<p>The local test issuer stands in for Microsoft Entra ID. Pick who you are:</p>"
            f"{body}</main></body></html>")


def _handler(signin: SignIn) -> type:
    prefix = f"/{TENANT}"

    class Handler(BaseHTTPRequestHandler):
        server_version = "sandbox-signin"

        def _send(self, status: int, body: bytes, content_type: str,
                  extra: Optional[Dict[str, str]] = None) -> None:
            self.send_response(status)
            headers = {"Content-Type": content_type, "Content-Length": str(len(body)),
                       "Cache-Control": "no-store",
                       **(extra or {})}
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, document: object) -> None:
            origin = self.headers.get("Origin")  # an SPA's token call is cross-origin (CORS, as Entra allows)
            self._send(status, json.dumps(document).encode(), "application/json",
                       {"Access-Control-Allow-Origin": origin} if origin else None)

        def _page(self, status: int, text: str) -> None:
            self._send(status, text.encode(), "text/html; charset=utf-8",
                       {"Content-Security-Policy": "default-src 'none'; form-action 'self' http: https:"})

        def _form(self) -> Dict[str, str]:
            length = min(int(self.headers.get("Content-Length") or 0), 64 * 1024)
            return {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode()).items()}

        def do_OPTIONS(self) -> None:
            self._send(204, b"", "text/plain", {
                "Access-Control-Allow-Origin": self.headers.get("Origin", "*"),
                "Access-Control-Allow-Methods": "POST", "Access-Control-Allow-Headers": "content-type",
                "Access-Control-Max-Age": "600"})

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            if parts.path == f"{prefix}/v2.0/.well-known/openid-configuration":
                return self._json(200, signin.discovery())
            if parts.path == f"{prefix}/discovery/v2.0/keys":
                return self._json(200, json.loads(signin.issuer.jwks_file.read_text()))
            if parts.path == f"{prefix}/oauth2/v2.0/authorize":
                refused = signin.check_authorize(query)
                if refused is None and query.get("prompt") == "none":  # no session kept: ask the person
                    return self._redirect(signin.answer(query, {"error": "login_required"}))
                return self._page(400 if refused else 200, login_page(query, refused))
            if parts.path == f"{prefix}/oauth2/v2.0/logout":
                target = query.get("post_logout_redirect_uri", "")
                if target and redirect_allowed(target, signin.redirect_uris):
                    return self._redirect(target)
                return self._page(200, "<!doctype html><html lang=\"en\"><title>Signed out</title>"
                                       "<main><p>Signed out.</p></main></html>")
            self._json(404, {"error": "not_found", "error_description": parts.path})

        def do_POST(self) -> None:
            path = urlsplit(self.path).path
            form = self._form()
            if path == f"{prefix}/oauth2/v2.0/token":
                return self._json(*signin.token(form))
            if path == f"{prefix}/oauth2/v2.0/authorize":
                role = form.pop("role", "")
                unknown = None if role in PEOPLE else f"unknown role {role!r}"
                refused = signin.check_authorize(form) or unknown
                if refused:
                    return self._page(400, login_page(form, refused))
                return self._redirect(signin.grant(form, role))
            self._json(404, {"error": "not_found", "error_description": path})

        def _redirect(self, location: str) -> None:
            self._send(302, b"", "text/plain", {"Location": location})

        def log_message(self, format: str, *args: object) -> None:
            print(f"signin: {self.command} {urlsplit(self.path).path} {args[1] if len(args) > 1 else ''}",
                  flush=True)

    return Handler


def certificate(directory: Path) -> Tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (made once per directory)."""
    cert_file, key_file = directory / "signin-cert.pem", directory / "issuer-private.pem"
    if not cert_file.exists():
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox sign-in (127.0.0.1)")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(
                    ipaddress.ip_address("127.0.0.1"))]), critical=False)
                .sign(key, hashes.SHA256()))  # type: ignore[arg-type]
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file


def serve(directory: Path, port: int, redirect_uris: Sequence[str],
          lifetime: int = 3600) -> ThreadingHTTPServer:
    issuer = LocalIssuer(directory).init()
    signin = SignIn(issuer, f"https://127.0.0.1:{port}", redirect_uris, lifetime)
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(signin))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate(directory))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.functions.signin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path,
                        help="the local issuer's directory (its key signs the tokens)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redirect-uri", action="append", default=[], help=f"default {DEFAULT_REDIRECT}")
    parser.add_argument("--lifetime", type=int, default=3600, help="seconds an access token lasts")
    args = parser.parse_args(argv)
    server = serve(args.directory, args.port, args.redirect_uri or [DEFAULT_REDIRECT], args.lifetime)
    print(f"signin: https://127.0.0.1:{args.port}/{TENANT} (authority)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
