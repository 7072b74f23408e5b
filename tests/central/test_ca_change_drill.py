"""Issue 22, point 2: the sandbox CA-change drill. The IMDS simulator (a real process) moves its
attested-document signer to a new intermediate mid-run (POST /admin/attestation/rotate); forwarders'
next keys are attested under it (the forwarder's own Attestor over HTTP); central (on Azurite, alerts to
a real webhook receiver) trusts the run's root and first intermediate, as a deployment trusts DigiCert G2
and the shipped Microsoft intermediates.

- reachable: the new intermediate is served at the signer's AIA URL; central (whose AIA allowlist names
  the loopback literal 127.0.0.1, as a drill must: production never fetches from loopback) fetches it:
  no envelope is lost, no alert is raised;
- unreachable: the AIA URL answers 404: one critical authn-trust alert naming the issuer and se-attest,
  every envelope kept; the operator then supplies the intermediate in AUTHN_TRUST_PEM (a setting change
  restarts the app), the timer's first tick re-verifies the kept envelopes as of when they were received
  and applies them: none lost, the one a newer incarnation superseded recorded and not acted on."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import requests

from central.runtime.service import CentralService
from forwarder.attestation import Attestor
from forwarder.imds import ImdsClient
from sandbox import processes
from tests.central.conftest import Env, Hook
from tests.central.factory import Vm, body, event

ISSUER_02 = "se-sandbox Test TLS Issuing CA 02"
NAMES = ("web_0", "web_1", "web_2")


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Tuple[processes.Server, str]]:
    server = processes.start_imds([*(a for n in NAMES for a in ("--vm", n)), "--rate-limit", "0",
                                   "--attestation-dir", str(tmp_path)], log_dir=tmp_path)
    yield server, (tmp_path / "trust.pem").read_text()
    server.stop()


def _admin(server: processes.Server, method: str, path: str, payload: Any = None) -> Any:
    with requests.Session() as session:
        session.trust_env = False
        answer = session.request(method, f"http://{processes.LOOPBACK}:{server.port}/admin{path}",
                                 json=payload, timeout=30)
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


class Forwarders:
    """Each VM's forwarder signing as it does on a VM: a boot key attested by the simulator over HTTP."""

    def __init__(self, server: processes.Server) -> None:
        self.server = server
        found = {n: _admin(server, "GET", f"/vms/{n}") for n in NAMES}
        self.vms = {n: Vm(n, vm_id=vm["vmId"], subscription=vm["subscriptionId"]) for n, vm in found.items()}
        self.clients: List[ImdsClient] = []
        self.reboot()

    def reboot(self) -> None:
        """Each forwarder's next key (a restart, or its half-life refresh): attested by the signer of now."""
        self.attestors: Dict[str, Attestor] = {}
        for name in NAMES:
            client = ImdsClient(f"http://{processes.LOOPBACK}:{self.server.port}/vms/{name}")
            self.clients.append(client)
            self.attestors[name] = Attestor(client)
            self.attestors[name].begin()

    def send(self, svc: CentralService, envs: List[Dict[str, Any]]) -> Any:
        bodies = [body(e) for e in envs]
        props = []
        for raw, env in zip(bodies, envs):
            attestor = self.attestors[env["subject"]]
            attestor.begin()
            props.append(attestor.sign(raw))
        return svc.handle_batch(bodies, now=dt.datetime.now(dt.timezone.utc), properties=props)

    def close(self) -> None:
        for client in self.clients:
            client.close()


@pytest.fixture
def forwarders(sim: Tuple[processes.Server, str]) -> Iterator[Forwarders]:
    fw = Forwarders(sim[0])
    yield fw
    fw.close()


def _central(env: Env, trust_pem: str) -> CentralService:
    # the simulator's root + first intermediate stand for certifi's root + the shipped intermediates;
    # AIA may reach the simulator only because its loopback literal is named (never by default)
    return CentralService.from_settings(env.settings(AUTHN_TRUST_PEM=trust_pem, AUTHN_AIA_HOSTS="127.0.0.1"))


def _soon(minutes: int = 20) -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=minutes)


def test_a_new_intermediate_served_at_its_aia_url_costs_no_envelope_and_no_alert(
        env: Env, hook: Hook, sim: Tuple[processes.Server, str], forwarders: Forwarders) -> None:
    server, trust_pem = sim
    svc = _central(env, trust_pem)
    vms = forwarders.vms
    before = forwarders.send(svc, [vms[n].incarnation_env([event(f"E-{n}", [n], not_before=_soon())])
                                   for n in NAMES])
    assert (before.processed, before.quarantined) == (3, 0)

    moved = _admin(server, "POST", "/attestation/rotate", {"aia": "served"})
    assert moved["issuer"] == ISSUER_02 and moved["reachable"] and "/aia/" in moved["aia"]
    forwarders.reboot()
    after = forwarders.send(svc, [vms[n].heartbeat() for n in NAMES] +
                            [vms[n].incarnation_env([], at=dt.datetime.now(dt.timezone.utc)) for n in NAMES])
    assert (after.processed, after.quarantined) == (6, 0)
    assert svc.sender_auth.trust.fetch.fetched == 1  # the new intermediate, fetched once and cached
    assert env.rows("Quarantine") == []
    assert [a for a in hook.alerts() if a.get("kind") in ("authn-trust", "quarantined")] == []
    assert svc.health()["senderAuthentication"]["heldForTrust"]["count"] == 0


def test_an_unreachable_intermediate_alerts_keeps_the_envelopes_and_applies_them_once_supplied(
        env: Env, hook: Hook, sim: Tuple[processes.Server, str], forwarders: Forwarders) -> None:
    server, trust_pem = sim
    svc = _central(env, trust_pem)
    vms = forwarders.vms
    first = forwarders.send(svc, [vms["web_0"].incarnation_env([event("E1", ["web_0"], not_before=_soon())]),
                                  vms["web_1"].incarnation_env([event("E2", ["web_1"], not_before=_soon())])])
    assert (first.processed, first.quarantined) == (2, 0)

    moved = _admin(server, "POST", "/attestation/rotate", {"aia": "unreachable"})
    assert moved["issuer"] == ISSUER_02 and not moved["reachable"]
    forwarders.reboot()
    outage = forwarders.send(svc, [
        vms["web_0"].incarnation_env([event("E1", ["web_0"], not_before=_soon()),
                                      event("E3", ["web_0"], not_before=_soon(30))]),
        vms["web_0"].heartbeat(),
        vms["web_1"].incarnation_env([event("E2", ["web_1"], not_before=_soon(25))]),
        vms["web_2"].incarnation_env([event("E4", ["web_2"], not_before=_soon())]),
    ])
    assert (outage.processed, outage.quarantined) == (0, 4)
    trust = [a for a in hook.alerts() if a.get("kind") == "authn-trust"]
    assert len(trust) == 1 and trust[0]["severity"] == "critical", trust
    assert ISSUER_02 in trust[0]["title"] and "se-attest" in trust[0]["text"]
    held = svc.health()["senderAuthentication"]["heldForTrust"]
    assert held["count"] == 4 and held["issuers"] == [ISSUER_02]
    assert {r["FailureClass"] for r in env.rows("Quarantine")} == {"trust"}

    # the operator supplies the intermediate (the admin answer's PEM, as one would download it); the
    # setting change restarts the app: a new instance with the repaired trust
    repaired = _central(env, trust_pem + moved["intermediatePem"])
    newer = forwarders.send(repaired, [vms["web_1"].incarnation_env([])])  # web_1's E2 is over: superseded
    assert newer.processed == 1
    repaired.reevaluate()  # the timer's first tick on this instance re-verifies the kept envelopes
    outcomes = repaired.reverifier.last
    assert (outcomes["verified"], outcomes["applied"], outcomes["superseded"], outcomes["untrusted"]) == \
        (4, 3, 1, 0), outcomes
    assert repaired.health()["senderAuthentication"]["heldForTrust"]["count"] == 0
    for event_id in ("E1", "E3", "E4"):
        assert repaired.event(event_id)["eventId"] == event_id  # applied: the kept reports count
    incs = {(r["VmName"], r["Incarnation"]): r["Applied"] for r in env.rows("Incarnations")}
    assert incs == {("web_0", 1): True, ("web_0", 2): True, ("web_1", 1): True, ("web_1", 2): False,
                    ("web_1", 3): True, ("web_2", 1): True}, incs
    rows = env.rows("Quarantine")
    assert sorted(r["Reverified"] for r in rows) == ["applied", "applied", "applied", "superseded"]
    # web_1's superseded report (E2 moved later) did not revive E2, which incarnation 3 ended
    e2 = repaired.event("E2")
    assert (e2["status"], e2["state"], len(e2["history"])) == ("Cancelled", "ended", 2), e2
