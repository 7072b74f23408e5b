"""Operators sign in (issue 27): function_app.py in the runner with App Service authentication emulated
(sandbox/functions/easyauth.py) and tokens from the local test issuer, on a store holding open events.

No token -> 401; a Reader reads but its approve is 403; an Operator's decision is recorded under the
token's name and object id, never the body's operator; a forged principal header is believed neither
with authentication on nor off; a named key's decision is recorded as key:<name>; unnamed keys decide
nothing."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import datetime, timedelta, timezone
from typing import Dict, Iterator, Optional, Tuple

import pytest
import requests

from central.runtime.service import CentralService
from sandbox import processes
from sandbox.functions.issuer import LocalIssuer
from tests import signing
from tests.central.factory import Vm, body, event

from .conftest import RunnerFiles, start_runner

PREFIX = "auth"
DEFAULT_KEY = "auth-default-host-key"
PAGER_KEY = "pagerbot-0f8a5c2e9b7d4e1a-named-function-key"
NOW = datetime.now(timezone.utc)
OPERATOR_OID = "11111111-2222-3333-4444-555555555555"
FORGED = base64.b64encode(json.dumps({
    "auth_typ": "aad", "claims": [
        {"typ": "http://schemas.microsoft.com/identity/claims/objectidentifier", "val": "forged-oid"},
        {"typ": "preferred_username", "val": "forged-ceo@contoso.com"},
        {"typ": "roles", "val": "Operator"}]}).encode()).decode()
FORGED_HEADERS = {"X-MS-CLIENT-PRINCIPAL": FORGED, "X-MS-CLIENT-PRINCIPAL-NAME": "forged-ceo@contoso.com",
                  "X-MS-CLIENT-PRINCIPAL-ID": "forged-oid"}


def seed(svc: CentralService) -> None:
    vm = Vm("vm-a")
    nb = NOW + timedelta(hours=2)
    events = [event(f"E-AUTH-{i}", ["vm-a"], "Freeze", not_before=nb) for i in range(1, 7)]
    svc.handle_batch([body(vm.heartbeat(at=NOW)), body(vm.incarnation_env(events, at=NOW))], now=NOW)


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[str, str, LocalIssuer, str]]:
    """(URL of central with App Service authentication on, URL with it off, the issuer, URL with it off
    but central validating tokens itself: OPERATOR_API_*), one store."""
    work = tmp_path_factory.mktemp("operator-auth")
    issuer = LocalIssuer(work / "issuer").init()
    azurite = processes.start_azurite(log_dir=work)
    hub = processes.start_eventhubs(("scheduled-events=2", f"{processes.PLATFORM_HUB}=1"), log_dir=work)
    storage = azurite.extra["connection_string"]
    values = {
        "AzureWebJobsStorage": storage,
        "ApprovalStorage": storage,
        **processes.central_hub_settings(hub.port, "scheduled-events"),
        "TABLE_PREFIX": PREFIX,
        "POLICY_JSON": json.dumps({"version": 1, "rules": [{"name": "manual", "action": "hold"}]}),
        "ALERT_WEBHOOK_URL": "",
        "ALERT_WEBHOOK_FORMAT": "generic",
        "REEVALUATE_SCHEDULE": "0 0 0 1 1 *",
        "OPERATOR_KEY_SHA256": json.dumps({"pagerbot": hashlib.sha256(PAGER_KEY.encode()).hexdigest()}),
    }
    seed(signing.central(values))  # what forwarders send: signed (central runs in AUTHN_MODE=required)
    keys = {"host": {"default": DEFAULT_KEY, "pagerbot": PAGER_KEY}}
    on, off = RunnerFiles(work / "on"), RunnerFiles(work / "off")
    on.write({**values, "EVENTHUB_CONSUMER_GROUP": "auth-on"}, keys=keys, auth=issuer.auth_section())
    # Off: the settings file even claims WEBSITE_AUTH_ENABLED; only the platform sets it, so it is dropped.
    off.write({**values, "EVENTHUB_CONSUMER_GROUP": "auth-off", "WEBSITE_AUTH_ENABLED": "True"}, keys=keys)
    # In-app: no platform authentication at all (as on a plan where it does not block); central checks.
    app = RunnerFiles(work / "app")
    app.write({**values, "EVENTHUB_CONSUMER_GROUP": "auth-app", **issuer.app_settings()}, keys=keys)
    runners = [start_runner(f, "function_app") for f in (on, off, app)]
    try:
        urls = [f"http://{processes.LOOPBACK}:{r.port}/api" for r in runners]
        yield urls[0], urls[1], issuer, urls[2]
    finally:
        for runner in runners:
            runner.stop()
        hub.stop()
        azurite.stop()


def call(url: str, token: Optional[str] = None, body: Optional[dict] = None,
         headers: Optional[Dict[str, str]] = None) -> requests.Response:
    session = requests.Session()
    session.trust_env = False
    sent = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    if body is None:
        return session.get(url, headers=sent, timeout=30)
    return session.post(url, headers=sent, json=body, timeout=30)


def decided_by(url: str, token: str, event_id: str) -> str:
    got = call(f"{url}/events/{event_id}", token)
    assert got.status_code == 200, got.text
    return got.json()["decisions"][-1]["decidedBy"]


def test_no_token_or_a_bad_one_is_401_and_health_needs_only_its_key(apps) -> None:
    on, _, issuer, _ = apps
    assert call(f"{on}/events/pending").status_code == 401
    assert call(f"{on}/fleet", headers={"x-functions-key": DEFAULT_KEY}).status_code == 401, (
        "a function key is no sign-in on the operators' routes")
    other = LocalIssuer(issuer.directory.parent / "other-issuer").init()  # same claims, another signer
    assert call(f"{on}/events/pending", other.token("eve@contoso.com", ["Operator"])).status_code == 401
    wrong_audience = issuer.token("eve@contoso.com", ["Operator"], audience="api://someone-else")
    assert call(f"{on}/events/pending", wrong_audience).status_code == 401
    expired = issuer.token("eve@contoso.com", ["Operator"], lifetime=-60)
    assert call(f"{on}/events/pending", expired).status_code == 401
    assert call(f"{on}/health").status_code == 401, "health is excluded from sign-in but keeps its key"
    assert call(f"{on}/health", headers={"x-functions-key": DEFAULT_KEY}).status_code == 200


def test_a_reader_reads_but_may_not_decide(apps) -> None:
    on, _, issuer, _ = apps
    reader = issuer.token("rita@contoso.com", ["Reader"])
    pending = call(f"{on}/events/pending", reader)
    assert pending.status_code == 200 and {e["eventId"] for e in pending.json()} >= {"E-AUTH-1"}
    assert call(f"{on}/fleet", reader).status_code == 200
    refused = call(f"{on}/events/E-AUTH-1/approve", reader, {"reason": "let me"})
    assert refused.status_code == 403 and "Operator" in refused.json()["error"]
    assert call(f"{on}/events/pending", issuer.token("nobody@contoso.com")).status_code == 403, "no role"
    assert decided_by(on, reader, "E-AUTH-1").startswith("policy:"), "the refused approve changed nothing"


def test_an_operators_decision_names_the_token_not_the_body(apps) -> None:
    on, _, issuer, _ = apps
    operator = issuer.token("olga@contoso.com", ["Operator"], object_id=OPERATOR_OID)
    held = call(f"{on}/events/E-AUTH-2/hold", operator,
                {"reason": "change freeze", "operator": "body-claims-carol"})
    assert held.status_code == 200, held.text
    who = decided_by(on, operator, "E-AUTH-2")
    assert who == f"operator:olga@contoso.com ({OPERATOR_OID})"
    assert "body-claims-carol" not in who
    reason = call(f"{on}/events/E-AUTH-2", operator).json()["decisions"][-1]["reason"]
    assert "not verified" in reason, "the body's operator is kept only as a note"


def test_a_forged_principal_header_is_never_believed(apps) -> None:
    on, off, issuer, _ = apps
    # On: the platform drops the client's copies and sets its own from the token.
    reader = issuer.token("rita@contoso.com", ["Reader"], object_id="r-oid")
    forged_on = call(f"{on}/events/E-AUTH-3/approve", reader, {"reason": "r"}, FORGED_HEADERS)
    assert forged_on.status_code == 403, "the forged Operator role was not believed"
    assert call(f"{on}/events/E-AUTH-3/hold", None, {"reason": "r"}, FORGED_HEADERS).status_code == 401
    # Off: central believes no principal header at all, so every operator route refuses.
    forged_off = call(f"{off}/events/E-AUTH-3/hold", None, {"reason": "r"},
                      {**FORGED_HEADERS, "x-functions-key": DEFAULT_KEY})
    assert forged_off.status_code == 401 and "authentication is off" in forged_off.json()["error"]
    assert call(f"{off}/events/pending", headers=FORGED_HEADERS).status_code == 401
    assert decided_by(on, reader, "E-AUTH-3").startswith("policy:")


@pytest.mark.parametrize("side", ["on", "off"])
def test_a_named_keys_decision_names_the_key_and_unnamed_keys_decide_nothing(apps, side: str) -> None:
    on, off, issuer, _ = apps
    url = on if side == "on" else off
    event_id = "E-AUTH-4" if side == "on" else "E-AUTH-5"
    route = f"{url}/automation/events/{event_id}/hold"
    assert call(route, None, {"reason": "r"}).status_code == 401, "the host wants a key"
    refused = call(route, None, {"reason": "r"}, {"x-functions-key": DEFAULT_KEY})
    assert refused.status_code == 403 and "OPERATOR_KEY_SHA256" in refused.json()["error"]
    done = call(route, None, {"reason": "pager: disk full on the host", "operator": "alice"},
                {"x-functions-key": PAGER_KEY, **FORGED_HEADERS})
    assert done.status_code == 200, done.text
    assert decided_by(on, issuer.token("rita@contoso.com", ["Reader"]), event_id) == "key:pagerbot"


def test_central_validates_tokens_itself_when_the_platform_does_not(apps) -> None:
    """OPERATOR_API_* set, no App Service authentication in front: the same answers, from central."""
    _, _, issuer, app = apps
    assert call(f"{app}/events/pending").status_code == 401
    assert call(f"{app}/events/pending", headers=FORGED_HEADERS).status_code == 401, "headers are no sign-in"
    other = LocalIssuer(issuer.directory.parent / "other-issuer").init()
    assert call(f"{app}/events/pending", other.token("eve@contoso.com", ["Operator"])).status_code == 401
    assert call(f"{app}/events/pending", issuer.token("eve@contoso.com", ["Operator"],
                                                      lifetime=-60)).status_code == 401
    reader = issuer.token("rita@contoso.com", ["Reader"], object_id="r-oid")
    assert call(f"{app}/fleet", reader).status_code == 200
    refused = call(f"{app}/events/E-AUTH-6/approve", reader, {"reason": "r"}, FORGED_HEADERS)
    assert refused.status_code == 403, "a Reader's token with a forged Operator header is still a Reader"
    operator = issuer.token("olga@contoso.com", ["Operator"], object_id=OPERATOR_OID)
    assert call(f"{app}/events/E-AUTH-6/hold", operator, {"reason": "r"}, FORGED_HEADERS).status_code == 200
    assert decided_by(app, operator, "E-AUTH-6") == f"operator:olga@contoso.com ({OPERATOR_OID})"
