"""The console's pieces without a browser: the files and headers the app serves, the sign-in settings,
the alert links, APP_PUBLIC_URL, the vendored msal-browser, and the local issuer's PKCE checks (whose
access tokens central's own validator accepts)."""

from __future__ import annotations

import base64
import json
import secrets
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List
from urllib.parse import parse_qs, urlsplit

import pytest

from central.model.alert import Alert
from central.runtime import console
from central.runtime.entra_tokens import TokenValidator
from central.runtime.operator_access import caller_from_claims
from central.runtime.settings import CentralSettings, SettingsError
from central.runtime.webhook import payload
from sandbox.functions.issuer import LocalIssuer
from sandbox.functions.signin import PEOPLE, SignIn, redirect_allowed, s256
from tools import console_vendor

ENTRA = {"OPERATOR_API_AUDIENCE": "api://7e1f3a2b-4c5d-4e6f-8a9b-0c1d2e3f4a5b",
         "OPERATOR_API_JWKS_URL": "https://login.microsoftonline.com/tid-1/discovery/v2.0/keys"}
T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def test_the_sign_in_settings_come_from_the_operator_api_settings() -> None:
    config = console.sign_in_config(ENTRA)
    assert config == {"clientId": "7e1f3a2b-4c5d-4e6f-8a9b-0c1d2e3f4a5b",
                      "authority": "https://login.microsoftonline.com/tid-1",
                      "knownAuthorities": ["login.microsoftonline.com"],
                      "scopes": ["api://7e1f3a2b-4c5d-4e6f-8a9b-0c1d2e3f4a5b/.default"],
                      "redirectPath": "/api/console/"}
    local = console.sign_in_config({**ENTRA, "OPERATOR_CONSOLE_AUTHORITY": "https://127.0.0.1:8443/t/"})
    assert local["authority"] == "https://127.0.0.1:8443/t"
    assert local["knownAuthorities"] == ["127.0.0.1:8443"]
    answer = console.asset("config.json", {})
    assert answer.status == 503 and "OPERATOR_API_AUDIENCE" in json.loads(answer.body)["error"]


def test_every_answer_has_a_strict_csp_and_only_listed_files_are_served(tmp_path: Path) -> None:
    csp = console.asset("", ENTRA).headers["Content-Security-Policy"]
    assert "script-src 'self';" in csp and "unsafe" not in csp and "frame-ancestors 'none'" in csp
    assert "connect-src 'self' https://login.microsoftonline.com;" in csp
    assert console.asset("console.js", ENTRA).content_type.startswith("text/javascript")
    for path in ("../function_app.py", "vendor/VERSION", "..%2Fhost.json", "index.htm"):
        assert console.asset(path, ENTRA).status == 404
    (tmp_path / "index.html").write_text("x")
    missing = console.asset("msal-browser.min.js", ENTRA, root=tmp_path)
    assert missing.status == 503 and b"make bootstrap" in missing.body


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: List[Dict[str, str]] = []
        self.inline: List[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        found = dict(attrs)
        self.inline += [f"{tag} {k}" for k in found if k.startswith("on") or k == "style"]
        if tag == "script":
            self.scripts.append(found)
            self._in_script = True

    def handle_endtag(self, tag: str) -> None:
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append("script body")


def test_the_page_has_no_inline_script_or_style_and_no_third_party_origin() -> None:
    markup = _Markup()
    markup.feed((console.CONSOLE_DIR / "index.html").read_text())
    assert markup.inline == []
    assert [s["src"] for s in markup.scripts] == [
        "/api/console/msal-browser.min.js", "/api/console/render.js", "/api/console/console.js"]
    for name in ("console.js", "render.js"):
        code = (console.CONSOLE_DIR / name).read_text()
        assert "innerHTML" not in code and "insertAdjacentHTML" not in code and "eval(" not in code


def test_the_vendored_msal_is_the_locked_version(tmp_path: Path) -> None:
    assert (console.CONSOLE_DIR / "vendor" / "VERSION").read_text().strip() == (
        f"@azure/msal-browser {console_vendor.locked_version()}")
    (tmp_path / "node_modules/@azure/msal-browser/lib").mkdir(parents=True)
    (tmp_path / "node_modules/@azure/msal-browser/package.json").write_text('{"version": "4.0.0"}')
    (tmp_path / "package-lock.json").write_text(json.dumps(
        {"packages": {"node_modules/@azure/msal-browser": {"version": "5.31.0"}}}))
    with pytest.raises(ValueError, match=r"pins 5\.31\.0: run `npm ci`"):
        console_vendor.copy(tmp_path)


def _alert(event_id: str = "E1/x") -> Alert:
    return Alert(f"{event_id}:Scheduled", "event-status", "warning", "Reboot Scheduled: db_0", "held", T0,
                 event_id or None, "Scheduled", {"eventId": event_id})


def test_every_alert_format_links_the_events_console_page() -> None:
    url = "https://se-prod.azurewebsites.net"
    link = "https://se-prod.azurewebsites.net/api/console/#event=E1%2Fx"
    assert payload(_alert(), "generic", url + "/")["link"] == link
    teams = payload(_alert(), "teams", url)["potentialAction"][0]
    assert teams["@type"] == "OpenUri" and teams["targets"] == [{"os": "default", "uri": link}]
    slack = payload(_alert(), "slack", url)["blocks"][-1]
    assert slack["type"] == "actions" and slack["elements"][0]["url"] == link
    assert payload(_alert(), "generic")["link"] is None  # no APP_PUBLIC_URL: no link
    assert "potentialAction" not in payload(_alert(""), "teams", url)  # not about an event: no button
    assert payload(_alert(""), "slack", url)["blocks"][-1]["type"] != "actions"


def test_app_public_url_must_be_https_except_on_loopback() -> None:
    assert CentralSettings.from_mapping({"APP_PUBLIC_URL": "https://a.example/"}).public_url == "https://a.example"
    assert CentralSettings.from_mapping({"APP_PUBLIC_URL": "http://127.0.0.1:7071"}).public_url
    for bad in ("http://a.example", "a.example", "https://a.example/?x=1"):
        with pytest.raises(SettingsError, match="APP_PUBLIC_URL"):
            CentralSettings.from_mapping({"APP_PUBLIC_URL": bad})


def test_loopback_redirect_uris_match_on_any_port_others_exactly() -> None:
    registered = ["http://127.0.0.1/api/console/", "https://se.example/api/console/"]
    assert redirect_allowed("http://127.0.0.1:49152/api/console/", registered)
    assert redirect_allowed("https://se.example/api/console/", registered)
    assert not redirect_allowed("https://se.example:444/api/console/", registered)
    assert not redirect_allowed("http://127.0.0.1:1/api/other/", registered)
    assert not redirect_allowed("http://evil.example/api/console/", registered)


def _authorize(signin: SignIn, verifier: str) -> Dict[str, str]:
    query = {"client_id": "se-operator-api-sandbox", "redirect_uri": "http://127.0.0.1:5000/api/console/",
             "response_type": "code", "code_challenge": s256(verifier), "code_challenge_method": "S256",
             "scope": "api://se-operator-api-sandbox/.default openid profile", "state": "s1", "nonce": "n1"}
    assert signin.check_authorize(query) is None
    back = urlsplit(signin.grant(query, "Reader"))
    answer = {k: v[0] for k, v in parse_qs(back.fragment).items()}
    assert answer["state"] == "s1"
    return {"grant_type": "authorization_code", "code": answer["code"], "code_verifier": verifier,
            "client_id": query["client_id"], "redirect_uri": query["redirect_uri"]}


def test_the_token_endpoint_checks_pkce_and_spends_a_code_once(tmp_path: Path) -> None:
    issuer = LocalIssuer(tmp_path).init()
    signin = SignIn(issuer, "https://127.0.0.1:8443", ["http://127.0.0.1/api/console/"])
    verifier = secrets.token_urlsafe(48)
    form = _authorize(signin, verifier)
    status, wrong = signin.token({**form, "code_verifier": verifier + "x"})
    assert status == 400 and "PKCE" in wrong["error_description"]
    form = _authorize(signin, verifier)  # the failed attempt spent that code: a new one
    status, tokens = signin.token(form)
    assert status == 200
    assert signin.token(form)[1]["error"] == "invalid_grant"  # used once only
    claims = TokenValidator(issuer.audience, issuer.issuer, issuer.jwks_file.as_uri()).claims(
        f"Bearer {tokens['access_token']}")
    assert isinstance(claims, dict), claims  # central's own validation accepts it
    assert caller_from_claims(claims).roles == {"Reader"} and claims["oid"] == PEOPLE["Reader"][1]
    id_claims = json.loads(base64.urlsafe_b64decode(tokens["id_token"].split(".")[1] + "=="))
    assert id_claims["nonce"] == "n1" and id_claims["aud"] == "se-operator-api-sandbox"
    info = json.loads(base64.urlsafe_b64decode(tokens["client_info"] + "=="))
    assert info == {"uid": PEOPLE["Reader"][1], "utid": "00000000-0000-0000-0000-000000000001"}
    plain = signin.check_authorize({"redirect_uri": "http://127.0.0.1/api/console/", "response_type": "code"})
    assert plain and "PKCE" in plain
