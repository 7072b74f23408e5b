"""One complete demo run: start the fleet, play the scenario, collect the evidence, check, stop.

Shared by `python -m sandbox.demo` and tests/e2e, so both exercise exactly the same wiring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional

from sandbox import processes
from sandbox.demo import operators, scenario
from sandbox.demo.fleet import Fleet, FleetSettings
from sandbox.demo.scenario import Check, Evidence, Scene

WORK = processes.REPO / ".demo"
BUDGET_SECONDS = 100.0  # everything after the fleet is up; the whole run stays well under 2 minutes


@dataclass
class Outcome:
    plan: List[Scene]
    t0: float = 0.0
    evidence: Optional[Evidence] = None
    checks: List[Check] = field(default_factory=list)
    error: str = ""
    startup_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.checks) and all(c.ok for c in self.checks)


def fresh_install(work: Path, **overrides: Any) -> FleetSettings:
    """The fleet as a new operator has it: no POLICY_JSON (built-in defaults), forwarders on their default
    approval settings (no local approve) and only the install's *.example hooks."""
    return FleetSettings(work=work, policy=None, local_approve=False, drain_hook=False, **overrides)


def run(work: Path = WORK, say: Callable[[str], None] = print,
        settings: Optional[FleetSettings] = None, plan: Optional[List[Scene]] = None) -> Outcome:
    settings = settings or FleetSettings(work=work)
    outcome = Outcome(plan=plan if plan is not None else scenario.scenes())
    fleet = Fleet(settings)
    began = time.monotonic()
    try:
        policy = "the built-in default policy" if settings.policy is None else "the scenario's policy"
        hooks = "a drain hook" if settings.drain_hook else "only the install's *.example hooks"
        say(f"policy: {policy}; forwarders with {hooks}")
        say(f"starting Azurite, Event Hubs, the IMDS simulator ({len(settings.vms)} VMs, time scale "
            f"{settings.time_scale:g}), the webhook receiver, {settings.central_instances} Functions runner "
            f"instances (central; sender authentication {'on' if settings.authenticate else 'off'}) and "
            f"{len(settings.vms)} forwarders (logs in {work})")
        fleet.start()
        fleet.wait_until_central_knows_every_vm()
        outcome.startup_seconds = time.monotonic() - began
        say(f"all up in {outcome.startup_seconds:.1f} s; central knows every VM\n")
        until = time.monotonic() + BUDGET_SECONDS
        outcome.t0 = scenario.play(fleet, outcome.plan, say, until=until - 15)
        scenario.settle(fleet, outcome.plan, timeout=max(1.0, min(20.0, until - time.monotonic())))
        outcome.evidence = scenario.collect(fleet, outcome.plan)
        outcome.checks = scenario.check(outcome.plan, outcome.evidence)
        rules = (settings.policy or {}).get("rules", [])
        if any(r.get("name") == "long-freeze-needs-an-operator" for r in rules):
            say("\nsigned-in operators (App Service authentication emulated; local test issuer's tokens):")
            outcome.checks += operators.play(fleet, say)
        dead = fleet.exited()
        if dead:
            outcome.error = "a process exited: " + "; ".join(dead)
    except Exception as exc:  # noqa: BLE001 - reported as the run's failure; the fleet is stopped below
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        fleet.stop()
    return outcome
