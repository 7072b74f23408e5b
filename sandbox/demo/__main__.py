"""`python -m sandbox.demo [--work DIR] [--evidence FILE] [--capture] [--fresh-install] | --serve`: run
the demo, print the timeline and the checks; exit 0 only if every check holds (1: a check failed, 130:
interrupted). With --capture the hub also writes Capture Avro files (kept in <work>/capture) and the example
analysis runs on them. With --fresh-install the fleet is a new operator's (default policy, no custom hook)
and the scenes are the impactful events that must then pass quietly: approved plainly, no critical alert.
With --serve: the practice fleet (sandbox/demo/practice.py), at real time and up until Ctrl-C (exit 0),
with commands to paste."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, List, Optional

from sandbox.demo import scenario, timeline
from sandbox.demo.fleet import FleetSettings
from sandbox.demo.run import WORK, Outcome, fresh_install, run


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds into run()'s finally: every PID is stopped


def write_evidence(outcome: Outcome, path: Path) -> None:
    """Everything the checks were made from, as JSON (tests/e2e asserts on it)."""
    doc = {"t0": outcome.t0, "error": outcome.error, "ok": outcome.ok,
           "scenes": [{"key": s.key, "eventId": s.event_id, "approver": s.approver,
                       "alerted": list(s.alerted), "spec": s.spec, "created": s.created}
                      for s in outcome.plan],
           "checks": [asdict(c) for c in outcome.checks],
           "evidence": asdict(outcome.evidence) if outcome.evidence is not None else None}
    path.write_text(json.dumps(doc, default=str, indent=1))


def _analyse_capture(work: Path, time_scale: float) -> None:
    files = sorted((work / "capture").rglob("*.avro"))
    print(f"\ncapture: {len(files)} Avro file(s) in {work / 'capture'} "
          "(<namespace>/<hub>/<partition>/<yyyy>/<mm>/<dd>/<hh>/<mm>/<ss>.avro)")
    if not files:
        return
    from examples.analysis.__main__ import main as analyse

    command = ["--dir", str(work / "capture"), "--group-by", "tag:role", "--out", str(work / "analysis"),
               "--export", str(work / "envelopes.jsonl"), "--time-scale", f"{time_scale:g}"]
    print("analysis: python -m examples.analysis " + " ".join(command), flush=True)
    analyse(command)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.demo", description=__doc__)
    parser.add_argument("--work", type=Path, default=WORK, help="logs, state, settings (wiped first)")
    parser.add_argument("--evidence", type=Path, default=None, help="also write the evidence as JSON")
    parser.add_argument("--capture", action="store_true",
                        help="Event Hubs Capture on: Avro files kept in <work>/capture, then the example "
                             "analysis writes <work>/analysis/summary.md and summary.png")
    parser.add_argument("--fresh-install", action="store_true",
                        help="default policy (no POLICY_JSON), forwarders with default settings and no "
                             "custom hook: a Reboot, a Redeploy and a long Freeze, each approved with no "
                             "critical alert")
    parser.add_argument("--witness", action="store_true",
                        help="only the second act: Azure as a second witness (platform feed, ARM approvals)")
    parser.add_argument("--no-witness", action="store_true", help="skip the second act")
    parser.add_argument("--serve", action="store_true",
                        help="the practice fleet: real time, a policy that leaves events pending, up until "
                             "Ctrl-C; prints the central URL, the function key and commands to paste")
    args = parser.parse_args(argv)
    if args.serve:
        from sandbox.demo.practice import serve

        return serve(args.work, say=lambda text: print(text, flush=True))
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    if args.witness:
        return _second_act(args.work, started)
    try:
        if args.fresh_install:
            settings, plan = fresh_install(args.work, capture=args.capture), scenario.fresh_install_scenes()
        else:
            settings, plan = FleetSettings(work=args.work, capture=args.capture), scenario.scenes()
        outcome = run(args.work, say=lambda text: print(text, flush=True), settings=settings, plan=plan)
    except KeyboardInterrupt:
        print("\ninterrupted: every process was stopped", file=sys.stderr, flush=True)
        return 130
    if outcome.evidence is not None:
        print("\ntimeline (" + timeline.legend() + ")")
        print(timeline.render(timeline.build(outcome.plan, outcome.evidence), outcome.t0))
    print("\nchecks:")
    for c in outcome.checks:
        print(f"  [{'ok' if c.ok else 'FAIL'}] {c.scene} {c.what}" + (f": {c.detail}" if c.detail else ""))
    if outcome.error:
        print(f"  [FAIL] {outcome.error}")
    if args.evidence is not None:
        write_evidence(outcome, args.evidence)
    if args.capture:
        _analyse_capture(args.work, settings.time_scale)
    missing = [c for c in outcome.checks if not c.ok]
    if outcome.ok:
        verdict = "passed"
    elif missing:
        verdict = f"FAILED ({len(missing)} of {len(outcome.checks)} checks not met)"
    else:
        verdict = "FAILED (see the [FAIL] line above)"
    print(f"\ndemo {verdict} in {time.monotonic() - started:.1f} s (logs in {args.work})", flush=True)
    if args.fresh_install or args.no_witness:
        return 0 if outcome.ok else 1
    second = _second_act(args.work / "witness", time.monotonic())
    return 0 if outcome.ok and second == 0 else 1


def _second_act(work: Path, started: float) -> int:
    """Azure as a second witness (sandbox/demo/witness.py): its own fleet, its own checks."""
    from sandbox.demo import witness

    print("", flush=True)
    try:
        outcome = witness.run(work, say=lambda text: print(text, flush=True))
    except KeyboardInterrupt:
        print("\ninterrupted: every process was stopped", file=sys.stderr, flush=True)
        return 130
    print("\nchecks (second act):")
    for c in outcome.checks:
        print(f"  [{'ok' if c.ok else 'FAIL'}] {c.scene} {c.what}" + (f": {c.detail}" if c.detail else ""))
    if outcome.error:
        print(f"  [FAIL] {outcome.error}")
    verdict = "passed" if outcome.ok else "FAILED"
    print(f"\nsecond act {verdict} in {time.monotonic() - started:.1f} s (logs in {work})", flush=True)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
