"""Central's fleet view shows coverage (issue 48: "Central's fleet view and the workbook show the same
counts"): central (the Functions runner running function_app.py on Azurite) reads the Resource Graph stand-in
itself with its managed identity (the IMDS simulator's, through azure-identity) and ARM_ENDPOINT, and GET
/api/fleet's "coverage" equals `se-fleet coverage --json`'s counts for the same world and fleet; a blind
VM shows; `se-fleet status` prints the counts. The reader's cache and failures are checked on
central.runtime.coverage_read.CoverageReader against the same stand-in."""

from __future__ import annotations

import io
import json
import time
from datetime import datetime, timezone
from typing import Any, Dict, List

import pytest
from azure.identity import DefaultAzureCredential

from central.cli import se_fleet as fleet_cli
from central.runtime import coverage_read
from central.runtime.settings import CentralSettings, SettingsError
from sandbox import processes

from .coverage_world import CENTRAL, SUB, admin, extension_row, vm_row, world

COUNTED = ("vms", "byVerdict", "byResourceGroup")


@pytest.fixture(scope="module")
def env(coverage_env: Dict[str, Any]) -> Dict[str, Any]:
    return coverage_env


def new_world(env: Dict[str, Any], doc: Dict[str, Any]) -> None:
    """Write the world and let central's 1 s cache (COVERAGE_REFRESH_SECONDS) expire."""
    admin(env, "world", doc)
    time.sleep(1.2)


def central_view(env: Dict[str, Any]) -> Dict[str, Any]:
    return fleet_cli.fetch(env["url"], env["token"])["coverage"]


def cli_counts(env: Dict[str, Any]) -> Dict[str, Any]:
    out = io.StringIO()
    fleet_cli.main(["coverage", "--subscription", SUB, "--url", env["url"], "--token", env["token"],
                    "--central-principal-id", CENTRAL, "--json"], out=out)
    return json.loads(out.getvalue())


def test_the_fleet_view_counts_what_se_fleet_coverage_counts(env: Dict[str, Any]) -> None:
    new_world(env, world())
    view = central_view(env)
    assert view["configured"] is True and view["error"] is None
    assert view["scopes"] == [f"/subscriptions/{SUB}"] and view["readAt"]
    report = cli_counts(env)
    assert {k: view[k] for k in COUNTED} == {k: report[k] for k in COUNTED}
    # not two empty answers: every kind of verdict, the bulk group (3 pages) agentless through the role
    assert view["byVerdict"]["blind"] == 1 and view["byVerdict"]["agentless"] > 1000
    assert all(view["byVerdict"][v] for v in ("agent", "silent agent", "excluded"))
    assert [b.rsplit("/", 1)[-1] for b in view["blind"]] == ["nothing"]


def test_a_blind_vm_shows_until_the_policy_covers_it(env: Dict[str, Any]) -> None:
    late = vm_row("late-1", "6f1e2d3c-0000-4000-8000-0000000000aa", group="late")
    new_world(env, world((late,)))
    view = central_view(env)
    assert sorted(b.rsplit("/", 1)[-1] for b in view["blind"]) == ["late-1", "nothing"]
    groups = {g["resourceGroup"]: g for g in view["byResourceGroup"]}
    assert groups["late"]["blind"] == 1
    new_world(env, world((late, extension_row("late-1", "late"))))
    view = central_view(env)
    assert {g["resourceGroup"]: g for g in view["byResourceGroup"]}["late"]["silent agent"] == 1
    assert [b.rsplit("/", 1)[-1] for b in view["blind"]] == ["nothing"]


def test_se_fleet_status_prints_the_counts(env: Dict[str, Any]) -> None:
    new_world(env, world())
    out = io.StringIO()
    fleet_cli.main(["status", "--url", env["url"], "--token", env["token"]], out=out)
    lines = out.getvalue().splitlines()
    report = cli_counts(env)
    total = ", ".join(f"{report['byVerdict'][v]} {v}" for v in report["byVerdict"])
    assert any(line.startswith(f"coverage of /subscriptions/{SUB}, read at ") for line in lines)
    assert f"  {SUB}/apps: 2 agent, 1 agentless, 2 silent agent, 1 blind, 1 excluded" in lines
    assert f"  {report['vms']} VM(s): {total}" in lines
    assert any(line.startswith("BLIND: nothing ") for line in lines)


def reader(env: Dict[str, Any], clock: List[float], endpoint: str = "",
           groups: tuple = ()) -> coverage_read.CoverageReader:
    return coverage_read.CoverageReader(
        lambda: DefaultAzureCredential(exclude_interactive_browser_credential=True),
        endpoint or f"http://127.0.0.1:{env['graph']}", () if groups else (SUB,), groups, CENTRAL, 300.0,
        clock=lambda: clock[0])


def test_one_read_per_refresh_whoever_asks(env: Dict[str, Any]) -> None:
    admin(env, "world", world())
    clock = [1000.0]
    one = reader(env, clock)
    now = datetime.now(timezone.utc)
    before = len(admin(env, "calls"))
    first = one.get(now)
    asked = len(admin(env, "calls")) - before
    assert asked == 4 and first.error == "" and len(first.machines) > 2000  # 3 inventory pages + the roles
    clock[0] += 299
    assert one.get(now) is first and len(admin(env, "calls")) - before == asked
    clock[0] += 2
    assert one.get(now) is not first and len(admin(env, "calls")) - before == 2 * asked
    assert one.reads == 2


def test_a_failed_read_is_an_error_in_the_view_never_an_exception(env: Dict[str, Any]) -> None:
    admin(env, "world", world())
    clock = [0.0]
    closed = reader(env, clock, f"http://127.0.0.1:{processes.free_port()}")
    section = coverage_read.section(closed, {"vms": []}, datetime.now(timezone.utc))
    assert section["configured"] and section["readAt"] is None and "vms" not in section
    assert section["error"].startswith("cannot reach Resource Graph at http://127.0.0.1:")
    refused = reader(env, clock, groups=("mg-unknown",))
    section = coverage_read.section(refused, {"vms": []}, datetime.now(timezone.utc))
    assert "403 AuthorizationFailed" in section["error"] and "needs Reader" in section["error"]
    # a good read, then a failing one: the last counts stay, beside the error; retried within a minute
    good = reader(env, clock)
    first = coverage_read.section(good, {"vms": []}, datetime.now(timezone.utc))
    assert first["error"] is None
    good.endpoint = f"http://127.0.0.1:{processes.free_port()}"
    clock[0] += 301
    section = coverage_read.section(good, {"vms": []}, datetime.now(timezone.utc))
    assert section["error"].startswith("cannot reach") and section["vms"] > 2000
    clock[0] += coverage_read.RETRY_SECONDS
    good.get(datetime.now(timezone.utc))
    assert good.reads == 3
    # a row not in the queries' shape (no id) is an error too, not an exception
    broken = world()
    broken["resources"].append({"type": "microsoft.compute/virtualmachines", "subscriptionId": SUB})
    admin(env, "world", broken)
    section = coverage_read.section(reader(env, clock), {"vms": []}, datetime.now(timezone.utc))
    assert section["error"].startswith("Resource Graph's rows are not in the inventory query's shape: "
                                       "KeyError")


def test_a_throttled_page_is_read_again_when_the_quota_resets(env: Dict[str, Any]) -> None:
    """Resource Graph's own throttling headers: a read of several pages survives a 429 or two; a quota that
    does not reset in time ends the read as an error in the view that says so, never an exception."""
    admin(env, "world", world())
    waits: List[float] = []
    clock = [0.0]
    one = coverage_read.CoverageReader(
        lambda: DefaultAzureCredential(exclude_interactive_browser_credential=True),
        f"http://127.0.0.1:{env['graph']}", (SUB,), (), CENTRAL, 300.0, clock=lambda: clock[0],
        sleep=waits.append)
    admin(env, "throttle", {"queries": 2, "resetsAfter": "00:00:03"})
    before = len(admin(env, "calls"))
    got = one.get(datetime.now(timezone.utc))
    assert got.error == "" and len(got.machines) > 2000
    assert waits == [3.0, 3.0] and len(admin(env, "calls")) - before == 4  # the throttled 2 are not answered
    admin(env, "throttle", {"queries": coverage_read.THROTTLE_TRIES, "resetsAfter": "00:00:02"})
    clock[0] += 301
    section = coverage_read.section(one, {"vms": []}, datetime.now(timezone.utc))
    assert "429 RateLimiting" in section["error"] and "quota resets after 00:00:02" in section["error"]
    assert section["vms"] > 2000  # the last good counts stay beside the error
    admin(env, "throttle", {"queries": 1, "resetsAfter": "00:05:00"})  # too long to wait inside a read
    clock[0] += coverage_read.RETRY_SECONDS
    waits.clear()
    assert "quota resets after 00:05:00" in one.get(datetime.now(timezone.utc)).error and waits == []
    admin(env, "throttle", {"queries": 0})


def test_throttle_wait_reads_both_headers() -> None:
    assert coverage_read.throttle_wait({"x-ms-user-quota-resets-after": "00:01:05"}) == 65.0
    assert coverage_read.throttle_wait({"Retry-After": "7"}) == 7.0
    assert coverage_read.throttle_wait({"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}) is None
    assert coverage_read.throttle_wait({}) is None


def test_without_scopes_the_view_says_coverage_is_not_configured(env: Dict[str, Any]) -> None:
    view = env["svc"].fleet()["coverage"]  # the in-process central: no COVERAGE_SCOPES
    assert view == {"configured": False, "note": view["note"]} and "COVERAGE_SCOPES" in view["note"]
    out = io.StringIO()
    fleet_cli.main(["status", "--url", env["url"], "--token", env["token"]], out=out)
    assert "coverage: not configured" not in out.getvalue()  # the runner's central has it


@pytest.mark.parametrize("value", ["0b5f2a9e", "/subscriptions/not-a-guid", "mg-b",
                                   f"/subscriptions/{SUB}/x"])
def test_a_bad_scope_is_one_actionable_line(value: str) -> None:
    with pytest.raises(SettingsError, match=r"^COVERAGE_SCOPES: .* is neither /subscriptions/<id> nor"):
        CentralSettings.from_mapping({"COVERAGE_SCOPES": value})
    with pytest.raises(SettingsError, match="COVERAGE_PRINCIPAL_ID must be"):
        CentralSettings.from_mapping({"COVERAGE_PRINCIPAL_ID": "central"})
