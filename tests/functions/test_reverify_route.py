"""`POST /api/authn/reverify` and `se-fleet reverify` (issue 22, point 2) against a real Functions runner
running function_app.py: envelopes refused for a trust failure while central did not know the signer's
CA are shown held by `se-fleet status`; after the repair (the runner starts with the CA in
AUTHN_TRUST_PEM), an Operator's `se-fleet reverify` applies them, a Reader's is refused."""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, Iterator

import pytest

from central.cli import se_fleet as fleet_cli
from central.runtime.service import CentralService
from sandbox import processes
from sandbox.functions.issuer import LocalIssuer
from tests.central.factory import Vm, body, event
from tests.signing import SIGNER

from .conftest import RunnerFiles, central_backends, start_runner

KEY = "reverify-function-key"
TOKENS: Dict[str, str] = {}


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("reverify")
    now = datetime.now(timezone.utc)
    with central_backends(work, "reverify", "rv") as values:
        yield from _repaired(work, values, now)


def _repaired(work: Path, values: Dict[str, str], now: datetime) -> Iterator[str]:
    broken = CentralService.from_settings(values)  # the defaults: the sandbox CA is unknown
    vm = Vm("web_0")
    bodies = [body(vm.incarnation_env([event("3F2A9C4E-0000-4000-8000-00000000000A", ["web_0"],
                                             not_before=now + timedelta(hours=1))], at=now)),
              body(vm.heartbeat(at=now))]
    assert broken.handle_batch(bodies, now=now, properties=SIGNER.as_claimed(bodies)).quarantined == 2
    issuer = LocalIssuer(work / "issuer").init()
    TOKENS["operator"] = issuer.token("olga@contoso.com", ["Operator"])
    TOKENS["reader"] = issuer.token("rita@contoso.com", ["Reader"])
    files = RunnerFiles(work / "central")
    # the repair: the operator adds the CA; the app restarts with the setting (its timer never fires here)
    files.write({**values, "AUTHN_TRUST_PEM": SIGNER.trust_pem}, keys={"host": {"default": KEY}},
                auth=issuer.auth_section())
    server = start_runner(files, "function_app")
    try:
        yield f"http://{processes.LOOPBACK}:{server.port}"
    finally:
        server.stop()


def cli(*argv: str) -> tuple:
    out = io.StringIO()
    return fleet_cli.main(list(argv), out=out), out.getvalue()


def test_held_envelopes_show_then_an_operator_reverify_applies_them(
        runner: str, capsys: pytest.CaptureFixture) -> None:
    code, text = cli("status", "--url", runner, "--token", TOKENS["reader"])
    assert code == fleet_cli.EXIT_OK, text  # no VM known yet: what it sent is held
    assert "WARNING: 2 envelope(s) held for trust" in text and "se-sandbox Test TLS Issuing CA 01" in text
    assert "se-fleet reverify" in text

    code, _ = cli("reverify", "--url", runner, "--token", TOKENS["reader"])
    assert code == fleet_cli.EXIT_UNREACHABLE
    assert capsys.readouterr().err.strip().endswith("your account lacks the Operator app role")

    code, text = cli("reverify", "--url", runner, "--token", TOKENS["operator"], "--json")
    answer = json.loads(text)
    assert code == fleet_cli.EXIT_OK, answer
    assert answer["outcomes"]["applied"] == 2 and answer["heldForTrust"]["count"] == 0

    code, text = cli("status", "--url", runner, "--token", TOKENS["reader"])
    assert code in (fleet_cli.EXIT_OK, fleet_cli.EXIT_SILENT), text  # answered (not refused or unreachable)
    assert "held for trust" not in text and text.splitlines()[1].startswith("web_0"), text
    code, text = cli("reverify", "--url", runner, "--token", TOKENS["operator"])
    assert code == fleet_cli.EXIT_OK and "nothing was held" in text, text
