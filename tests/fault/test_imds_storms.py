"""IMDS fault storms against a running forwarder (real process, file sink): 429 bursts, 410, 500/503
(also on compute metadata), slow answers past the read timeout, malformed JSON, schema-invalid documents,
and IMDS resets (the simulator's `reset` drops the incarnation counter, as after a host change).

Proves: the process stays alive through every phase, each injected fault was actually served to it
(the simulator's armed-fault list drains), every bad body became a quarantined envelope (malformed ->
no document, invalid -> the parsed document with schema errors), an IMDS reset is published with
`reset: true`, and afterwards the forwarder catches up: the current document is the last published
incarnation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from sandbox import processes
from tests.forwarder.helpers import Forwarder, admin, imds_url, of_type, read_published, wait_until

# Rounds of the storm; the full form also triples each burst.
ROUNDS = {"short": 1, "full": 6}


def storm(full: bool) -> List[Dict[str, Any]]:
    k = 3 if full else 1
    return [
        {"kind": "status", "status": 429, "count": 2 * k},
        {"kind": "status", "status": 410, "count": k},
        {"kind": "status", "status": 500, "count": 2 * k},
        {"kind": "slow", "seconds": 6, "count": 1},  # past the 5 s read timeout once IMDS answered
        {"kind": "status", "status": 503, "count": k, "path": "any"},
        {"kind": "status", "status": 429, "count": k, "path": "any"},
    ]


def change(imds: processes.Server) -> int:
    admin(imds, "POST", "/events", {"eventType": "Freeze", "resources": ["vm0"], "noticeSeconds": 86400})
    return current(imds)


def current(imds: processes.Server) -> int:
    return int(admin(imds, "GET", "/vms/vm0/document")["DocumentIncarnation"])


def faults_drained(imds: processes.Server) -> bool:
    """Every armed fault on the scheduled-events path was served (compute is read at start only)."""
    return all(f.get("path") == "compute" for f in admin(imds, "GET", "/faults"))


@pytest.mark.parametrize("form", ["short", pytest.param("full", marks=pytest.mark.slow)])
def test_imds_fault_storm_no_crash_bad_bodies_quarantined_then_catch_up(form: str, tmp_path: Path) -> None:
    imds = processes.start_imds(["--time-scale", "60"], log_dir=tmp_path)
    out = tmp_path / "published.jsonl"
    fw = Forwarder(imds_url(imds), tmp_path / "state", out).start()
    alive_checks = 0
    resets = 0
    try:
        wait_until(lambda: of_type(read_published(out), "incarnation"), timeout=60,
                   what="the first incarnation")
        for round_no in range(ROUNDS[form]):
            latest = change(imds)
            for spec in storm(form == "full"):
                admin(imds, "POST", "/faults", spec)
            wait_until(lambda: faults_drained(imds), timeout=120, step=0.25, what="the storm served")
            assert fw.alive(), "the forwarder died in the status/slow storm"
            alive_checks += 1
            caught_up(out, latest, f"round {round_no}: after the status storm")
            # Bad bodies, each after a change so each round's bodies differ (dedupe is per body hash).
            for kind in ("malformed", "invalid"):
                latest = change(imds)
                admin(imds, "POST", "/faults", {"kind": kind, "count": 2})
                wait_until(lambda: faults_drained(imds), timeout=60, what=f"{kind} bodies served")
                assert fw.alive(), f"the forwarder died on a {kind} body"
                alive_checks += 1
                caught_up(out, latest, f"round {round_no}: after {kind} bodies")
            if round_no % 2 == 0:
                admin(imds, "POST", "/faults", {"kind": "reset"})
                resets += 1
                caught_up(out, current(imds), f"round {round_no}: the reset incarnation")
        final = change(imds)
        caught_up(out, final, "the catch-up")
        final_document = admin(imds, "GET", "/vms/vm0/document")
        assert fw.alive()
        assert fw.terminate() == 0
    finally:
        if fw.alive():
            fw.kill()
        imds.stop()

    published = read_published(out)
    quarantined = of_type(published, "quarantined")
    malformed = [q for q in quarantined if q["data"]["document"] is None]
    invalid = [q for q in quarantined if q["data"]["document"] is not None]
    rounds = ROUNDS[form]
    assert len(malformed) >= rounds and len(invalid) >= rounds, "every round's bad bodies quarantined"
    assert all(q["data"]["errors"] and q["data"]["raw"] for q in quarantined), "each with its errors and body"
    incs = of_type(published, "incarnation")
    assert sum(1 for e in incs if e["data"]["reset"]) >= resets
    assert incs[-1]["data"]["document"] == final_document, "caught up: the current document was published"
    print(f"rounds={rounds} alive checks={alive_checks} quarantined={len(quarantined)} "
          f"(malformed {len(malformed)}, invalid {len(invalid)}) resets={resets} incarnations={len(incs)}")


def caught_up(out: Path, number: int, what: str) -> None:
    wait_until(lambda: incarnation_numbers(out)[-1:] == [number], timeout=60, what=f"{what} ({number})")


def incarnation_numbers(path: Path) -> List[int]:
    return [e["data"]["incarnation"] for e in of_type(read_published(path), "incarnation")]
