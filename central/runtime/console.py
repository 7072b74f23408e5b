"""The on-call console's files as the Function app serves them (GET /api/console/...): pure functions over
a path and the app settings, so function_app.py only binds the route.

The page is static (central/console/: HTML, CSS, JS; no inline script) plus @azure/msal-browser, which
`make bootstrap` and azd's prepackage hook copy from node_modules (pinned in package.json and
package-lock.json) into central/console/vendor/, so it ships inside the Functions deployment package; no
CDN. The page reads its sign-in settings from /api/console/config.json (the operator API's app
registration and the tenant's authority) and calls the operator API with the signed-in person's token.

Every answer carries a strict Content-Security-Policy: scripts and styles from this origin only, network
calls to this origin and the sign-in authority only, no framing, no plugins, no inline anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional
from urllib.parse import urlsplit

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
MSAL_FILE = "vendor/msal-browser.min.js"
# The only files served (no directory walking): path under /api/console/ -> (file, content type)
FILES = {
    "": ("index.html", "text/html; charset=utf-8"),
    "index.html": ("index.html", "text/html; charset=utf-8"),
    "console.css": ("console.css", "text/css; charset=utf-8"),
    "console.js": ("console.js", "text/javascript; charset=utf-8"),
    "render.js": ("render.js", "text/javascript; charset=utf-8"),
    "msal-browser.min.js": (MSAL_FILE, "text/javascript; charset=utf-8"),
}
DEFAULT_AUTHORITY_HOST = "https://login.microsoftonline.com"


@dataclass(frozen=True)
class Asset:
    status: int
    body: bytes
    content_type: str
    headers: Dict[str, str]


def authority(environment: Mapping[str, str]) -> str:
    """Where people sign in: OPERATOR_CONSOLE_AUTHORITY, else the tenant's authority read from
    OPERATOR_API_JWKS_URL (https://<login host>/<tenant>/discovery/v2.0/keys: the part before /discovery)."""
    given = str(environment.get("OPERATOR_CONSOLE_AUTHORITY", "")).strip().rstrip("/")
    if given:
        return given
    jwks = str(environment.get("OPERATOR_API_JWKS_URL", "")).strip()
    marker = "/discovery/v2.0/keys"
    return jwks[: -len(marker)] if jwks.startswith("https://") and jwks.endswith(marker) else ""


def sign_in_config(environment: Mapping[str, str]) -> Dict[str, object]:
    """The page's MSAL settings: the operator API's client id (from OPERATOR_API_AUDIENCE, api://<client
    id>), the authority, and the scope (<audience>/.default: the app roles come with it). ValueError
    (one line, what to set) when the console cannot sign anyone in."""
    audience = str(environment.get("OPERATOR_API_AUDIENCE", "")).strip().rstrip("/")
    where = authority(environment)
    if not audience or not where:
        raise ValueError("the console cannot sign anyone in: set OPERATOR_API_AUDIENCE (api://<client id>) "
                         "and OPERATOR_API_JWKS_URL or OPERATOR_CONSOLE_AUTHORITY (infra/app/function.bicep "
                         "sets them)")
    client_id = audience[len("api://"):] if audience.startswith("api://") else audience
    return {"clientId": client_id, "authority": where, "knownAuthorities": [urlsplit(where).netloc],
            "scopes": [f"{audience}/.default"], "redirectPath": "/api/console/"}


def security_headers(environment: Mapping[str, str]) -> Dict[str, str]:
    """CSP and friends for every console answer. connect-src: this origin and the authority (the token
    endpoint, cross-origin as in Entra); form-action: the sign-in page posts back to the authority."""
    where = authority(environment)
    origin = f"{urlsplit(where).scheme}://{urlsplit(where).netloc}" if where else ""
    connect = " ".join(x for x in ("'self'", origin) if x)
    csp = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
           f"connect-src {connect}; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}


def asset(path: str, environment: Mapping[str, str], root: Optional[Path] = None) -> Asset:
    """GET /api/console/<path>: a listed file, the sign-in config, or a 404 / 503 saying why."""
    root = root or CONSOLE_DIR
    name = path.strip("/")
    headers = security_headers(environment)
    if name == "config.json":
        try:
            body = json.dumps(sign_in_config(environment)).encode()
            return Asset(200, body, "application/json", headers)
        except ValueError as exc:
            body = json.dumps({"error": str(exc), "status": 503}).encode()
            return Asset(503, body, "application/json", headers)
    if name not in FILES:
        return Asset(404, b"not a console file", "text/plain; charset=utf-8", headers)
    file, content_type = FILES[name]
    try:
        return Asset(200, (root / file).read_bytes(), content_type, headers)
    except FileNotFoundError:
        missing = (f"{file} is missing from the deployment: run `make bootstrap` (or `npm ci` and "
                   "`python -m tools.console_vendor`) before `azd deploy`")
        return Asset(503, missing.encode(), "text/plain; charset=utf-8", headers)
