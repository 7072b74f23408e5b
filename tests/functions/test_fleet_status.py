"""`GET /api/fleet` and `se-fleet status` (issue 15, item 2) against two real Functions runner processes
running function_app.py on one store: both answer the same fleet; the table lists silent VMs first and
the exit code says whether any VM is silent."""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from central.cli import se_fleet as fleet_cli
from sandbox import processes
from sandbox.functions.issuer import LocalIssuer
from tests import signing
from tests.central.factory import Vm, body, event

from .conftest import RunnerFiles, central_backends, start_runner

KEY = "fleet-function-key"
TOKENS: Dict[str, str] = {}


@pytest.fixture(scope="module")
def runners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[List[str]]:
    work = tmp_path_factory.mktemp("fleet")
    # taken here, not at import: on a loaded machine a file can run minutes after its collection, and
    # the live VM must still be within LEADER_LIVENESS_SECONDS (300 s) when the tests ask
    now = datetime.now(timezone.utc)
    policy = {"version": 1, "budgets": {"sets": {"groupBy": "scaleSet", "maxImpacted": 1}},
              "rules": [{"name": "manual", "action": "hold"}]}
    with central_backends(work, "fleet", "fleet", policy) as values:
        yield from _servers(work, values, now)


def _servers(work: Path, values: Dict[str, str], now: datetime) -> Iterator[List[str]]:
    svc = signing.central(values)
    live, silent = Vm("web_0", scale_set="web"), Vm("web_1", scale_set="web")
    an_hour_ago = now - timedelta(hours=1)
    svc.handle_batch([body(silent.heartbeat(at=an_hour_ago))], now=an_hour_ago)
    svc.handle_batch([body(live.heartbeat(at=now)), body(live.incarnation_env(
        [event("3F2A9C4E-0000-4000-8000-000000000001", ["web_0"], not_before=now + timedelta(hours=1))],
        at=now))], now=now)
    servers = []
    issuer = LocalIssuer(work / "issuer").init()
    TOKENS["reader"] = issuer.token("rita@contoso.com", ["Reader"])
    TOKENS["nobody"] = issuer.token("nora@contoso.com")
    for n in range(2):
        files = RunnerFiles(work / f"central-{n}")
        files.write(values, keys={"host": {"default": KEY}}, auth=issuer.auth_section())
        servers.append(start_runner(files, "function_app"))
    try:
        yield [f"http://{processes.LOOPBACK}:{s.port}" for s in servers]
    finally:
        for server in servers:
            server.stop()


def status(url: str, *extra: str) -> tuple:
    out = io.StringIO()
    code = fleet_cli.main(["status", "--url", url, "--token", TOKENS["reader"], *extra], out=out)
    return code, out.getvalue()


def test_both_instances_answer_the_same_fleet(runners: List[str]) -> None:
    answers = [json.loads(status(url, "--json")[1]) for url in runners]
    for answer in answers:
        answer.pop("at")
    assert answers[0] == answers[1]
    assert [(v["name"], v["silent"]) for v in answers[0]["vms"]] == [("web_1", True), ("web_0", False)]


def test_status_renders_a_table_and_exits_1_while_a_vm_is_silent(runners: List[str]) -> None:
    code, text = status(runners[1])
    assert code == fleet_cli.EXIT_SILENT
    lines = text.splitlines()
    assert lines[0].split() == ["VM", "GROUPS", "LAST", "HEARD", "BACKLOG", "DROPPED", "VERSION", "OPEN",
                                "EVENTS", "STATE"]
    assert lines[1].startswith("web_1") and lines[1].endswith("SILENT")
    assert lines[2].startswith("web_0") and "3F2A9C4E" in lines[2] and lines[2].endswith("live")
    assert "2 VM(s): 1 live, 1 silent" in text
    code, text = status(runners[0], "--silent-only")
    table = text.split("\n\n")[0].splitlines()
    assert code == fleet_cli.EXIT_SILENT and [row.split()[0] for row in table[1:]] == ["web_1"]


def test_status_says_what_is_wrong_in_one_line(runners: List[str], capsys: pytest.CaptureFixture) -> None:
    assert fleet_cli.main(["status", "--url", runners[0], "--token", "not.a.token"], out=io.StringIO()) == 4
    assert capsys.readouterr().err.strip() == ("se-fleet: central answered 401 Unauthorized: sign in again "
                                               "(the token is missing, expired or for another API)")
    nobody = ["status", "--url", runners[0], "--token", TOKENS["nobody"]]
    assert fleet_cli.main(nobody, out=io.StringIO()) == 4
    assert capsys.readouterr().err.strip().endswith("your account lacks the Reader or Operator app role")
    assert fleet_cli.main(["status", "--url", "ftp://x", "--token", "t"], out=io.StringIO()) == 3
    assert fleet_cli.main(["status"], out=io.StringIO()) == 3
    closed = f"http://{processes.LOOPBACK}:{processes.free_port()}"
    assert fleet_cli.main(["status", "--url", closed, "--token", "t"], out=io.StringIO()) == 4
    assert "is not reachable" in capsys.readouterr().err
