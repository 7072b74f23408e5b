"""docs/openapi.yaml against the real routes: function_app.py in the sandbox runner over HTTP, on a store
holding a few events (open, held, ended). schemathesis generates requests from the spec, valid and not,
and checks every answer against it (status codes, content types, response schemas, no server error);
and the spec's paths are exactly the app's HTTP routes."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from central.runtime.service import CentralService
from sandbox import processes
from sandbox.functions.issuer import LocalIssuer
from sandbox.functions.loader import load_functions
from tests import signing
from tests.central.factory import Vm, body, event

from .conftest import RunnerFiles, central_backends, start_runner

REPO = processes.REPO
SPEC = REPO / "docs" / "openapi.yaml"
KEY = "contract-function-key"
PREFIX = "contract"
NOW = datetime.now(timezone.utc)
schema = schemathesis.openapi.from_path(SPEC)
# Both of the spec's security schemes at once: the host's key (health, automation) and an Operator's token.
HEADERS = {"x-functions-key": KEY}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("contract")
    with central_backends(work, "contract", PREFIX) as values:
        yield from _api(work, values)


def _api(work: Path, values: Dict[str, str]) -> Iterator[str]:
    seed(signing.central(values))
    files = RunnerFiles(work / "central")
    issuer = LocalIssuer(work / "issuer").init()
    files.write(values, keys={"host": {"default": KEY}}, auth=issuer.auth_section())
    HEADERS["Authorization"] = "Bearer " + issuer.token("contract@example.com", ["Operator"])
    runner = start_runner(files, "function_app")
    try:
        yield f"http://{processes.LOOPBACK}:{runner.port}/api"
    finally:
        runner.stop()


def seed(svc: CentralService) -> None:
    """Open events (one held by policy, one held by an operator) and one that ended."""
    a, b = Vm("vm-a"), Vm("vm-b")
    nb = NOW + timedelta(hours=2)
    svc.handle_batch([body(a.heartbeat(at=NOW)), body(b.heartbeat(at=NOW)),
                      body(a.incarnation_env([event("E-OPEN-1", ["vm-a"], not_before=nb),
                                              event("E-OPEN-2", ["vm-a"], "Redeploy", not_before=nb)],
                                             at=NOW)),
                      body(b.incarnation_env([event("E-GONE", ["vm-b"], not_before=nb)], at=NOW)),
                      body(b.incarnation_env([], at=NOW))], now=NOW)
    svc.decide("E-OPEN-2", "hold", "seed", "held for the contract test", now=NOW)


@schema.parametrize()
@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_route_answers_as_the_spec_says(case: schemathesis.Case, api: str) -> None:
    case.call_and_validate(base_url=api, headers=HEADERS)


def test_known_events_answer_with_their_history_and_errors_are_json(api: str) -> None:
    session = requests.Session()
    session.trust_env = False
    headers = dict(HEADERS)
    got = session.get(f"{api}/events/e-open-2", headers=headers, timeout=10)  # any case
    assert got.status_code == 200 and got.json()["operatorHold"] is True
    assert [d["action"] for d in got.json()["decisions"]] == ["hold", "operator-hold"]
    for path, status in (("/events/NOPE", 404),):
        answer = session.get(f"{api}{path}", headers=headers, timeout=10)
        assert answer.status_code == status and set(answer.json()) == {"error", "status"}
        assert answer.json()["status"] == status
    answer = session.post(f"{api}/events/E-OPEN-1/approve", headers=headers, timeout=10,
                          json={"operator": "x", "reason": "y", "hook": "yes"})
    assert answer.status_code == 400 and answer.json()["error"] == '"hook" must be true or false'
    assert session.get(f"{api}/health", timeout=10).status_code == 401  # the host's: no key, no body


def test_the_spec_lists_exactly_the_apps_routes() -> None:
    routes = set()
    for spec in load_functions("function_app"):
        if spec.trigger_type != "httpTrigger" or spec.name == "console":  # the page's files, not the API
            continue
        template = re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: "{" + m.group(1) + "}", spec.trigger["route"])
        for method in spec.trigger["methods"]:
            routes.add((method.lower(), "/" + template.replace("{event_id}", "{eventId}")))
    documented = {(method, path) for path, item in schema.raw_schema["paths"].items() for method in item}
    assert documented == routes
    assert Path(SPEC).read_text().count("operationId:") == len(routes)
