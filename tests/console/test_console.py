"""The on-call console in a real browser (headless Chromium) against the sandbox pipeline: the Functions
runner with the real function_app.py, central, Azurite, the Event Hubs server, the IMDS simulator and the
forwarders, and the local issuer's Entra-shaped sign-in (sandbox/functions/signin.py) that
@azure/msal-browser signs in to with auth code + PKCE.

One practice fleet serves the file (the db VMs' events are held for a person), with the platform's
authentication off (the runner's App Service authentication emulation disabled, as on Flex Consumption):
central's own token validation is all that guards the data. Each test has its own browser context (its
own session storage, so its own sign-in). The practice fleet with it on is tests/e2e's. Screenshots and
the page's weight go to tests/console/artefacts/ (gitignored).
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
import requests
from playwright.sync_api import Browser, Page, sync_playwright

from sandbox.demo.fleet import Fleet, FleetSettings, VmSpec
from sandbox.demo.practice import practice_policy

from .browser import ARTEFACTS, FLAGS, axe_serious, chromium_path, sign_in

HOSTILE = "db-<script>alert(1)<script>"  # a VM name as a VM could report it (IMDS names come from VMs)
VMS = (VmSpec("vm-a", {"role": "web"}), VmSpec("vm-b", {"role": "db"}), VmSpec("vm-c", {"role": "db"}),
       VmSpec(HOSTILE, {"role": "db"}))


def wait(check: Callable[[], Optional[Any]], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout:g} s: {what}")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    chromium_path()  # fail before starting anything when the browser is missing
    settings = FleetSettings(work=tmp_path_factory.mktemp("console"), vms=VMS, time_scale=1.0,
                             policy=practice_policy(datetime.now(timezone.utc)), central_instances=1,
                             reevaluate_schedule="*/5 * * * * *", sign_in=True,
                             platform_auth=False)  # as on Flex Consumption: central alone checks tokens
    with Fleet(settings) as running:
        running.wait_until_central_knows_every_vm(timeout=90)
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium_path(), args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    # the issuer's certificate is self-signed (a person accepts it once; the test context trusts it)
    context = browser.new_context(ignore_https_errors=True, viewport={"width": 1100, "height": 800})
    opened = context.new_page()
    problems: List[str] = []
    opened.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    opened.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text else None)
    opened.on("dialog", lambda d: problems.append(f"a dialog opened: {d.message}"))
    yield opened
    context.close()
    assert problems == [], problems  # no script error, no CSP refusal, no alert() from a VM's name


def held_event(fleet: Fleet, resources: List[str]) -> Dict[str, Any]:
    """A 30 s Freeze on `resources` (db VMs: the policy holds it), once central shows it held."""
    added = fleet.imds.add_event(eventType="Freeze", resources=resources, durationInSeconds=30)
    return wait(lambda: next((e for e in fleet.central("events/pending")
                              if e["eventId"] == added["eventId"] and e["state"] == "held"), None),
                60, f"central holds {added['eventId']}")


def alerts(fleet: Fleet) -> List[Dict[str, Any]]:
    """What the webhook receiver got (generic format), oldest first."""
    path = fleet.work / "alerts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def card(page: Page, event_id: str) -> Any:
    return page.locator(f'article[data-event="{event_id}"]')


def test_a_reader_sees_a_held_event_and_cannot_decide(fleet: Fleet, page: Page) -> None:
    event = held_event(fleet, ["vm-b", "vm-c"])
    sign_in(page, fleet.console_url, "Reader")
    assert "rita.reader@contoso.com (Reader)" in page.locator("#who").inner_text()
    found = card(page, event["eventId"])
    found.wait_for(timeout=20_000)
    text = found.inner_text()
    assert "Freeze on vm-b, vm-c" in text and "held" in text
    assert "db-needs-a-person" in text  # why, in central's own words (the rule and its reason)
    assert re.search(r"NotBefore\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(in \d+ min", text)
    assert found.locator("button").count() == 0  # no decide buttons for a Reader
    assert page.get_by_role("button", name=re.compile("Approve|Hold|Release")).count() == 0
    assert re.search(r"Data from .* ago; refreshes every 15 s", page.locator("#age").inner_text())
    ARTEFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTEFACTS / "pending-reader.png"), full_page=True)


def test_an_operator_approves_with_a_reason_and_the_vm_is_approved(fleet: Fleet, page: Page) -> None:
    event = held_event(fleet, ["vm-b", "vm-c"])
    sign_in(page, fleet.console_url, "Operator")
    found = card(page, event["eventId"])
    found.wait_for(timeout=20_000)
    ARTEFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTEFACTS / "pending-operator.png"), full_page=True)
    found.get_by_role("button", name="Approve…").click()
    dialog = page.locator("#confirm")
    what = dialog.locator("#confirm-what").inner_text()
    assert what.startswith("vm-b, vm-c freezes now, not waiting for its NotBefore"), what
    assert "db-needs-a-person" in what
    dialog.get_by_role("button", name="Approve").click()  # no reason: the form refuses
    assert dialog.is_visible() and fleet.imds.event(event["eventId"])["approvedBy"] == []
    dialog.get_by_label("Reason").fill("console test: approved on call")
    dialog.get_by_role("button", name="Approve").click()
    page.locator("#notice", has_text="Done: approve recorded").wait_for(timeout=20_000)
    seen = wait(lambda: fleet.imds.event(event["eventId"])["approvedBy"], 60,
                "the IMDS simulator sees the VM's approval")
    assert set(seen) <= {"vm-b", "vm-c"}
    # the alert about the event leads to its story: the decision with who made it and why
    link = wait(lambda: next((a["body"]["link"] for a in alerts(fleet)
                              if a["body"].get("eventId") == event["eventId"]), None),
                30, "an alert with a link")
    assert link == f"{fleet.console_url}#event={event['eventId']}"
    page.goto(link)
    story = page.locator("#view")
    story.get_by_text("operator:olga.operator@contoso.com", exact=False).first.wait_for(timeout=20_000)
    assert "console test: approved on call" in story.inner_text()
    page.screenshot(path=str(ARTEFACTS / "event-story.png"), full_page=True)


def test_a_vm_name_carrying_script_is_shown_as_text(fleet: Fleet, page: Page) -> None:
    sign_in(page, fleet.console_url, "Reader")
    page.goto(f"{fleet.console_url}#fleet")
    page.locator("#view h1", has_text="Fleet").wait_for(timeout=20_000)
    cell = page.locator("td", has_text=HOSTILE)
    cell.first.wait_for(timeout=20_000)
    assert cell.first.inner_text() == HOSTILE  # the characters, not markup
    assert page.locator("#view script").count() == 0
    assert page.evaluate("document.scripts.length") == 3  # the page's own three files only
    ARTEFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTEFACTS / "fleet.png"), full_page=True)


def test_an_expired_session_asks_to_sign_in_again(fleet: Fleet, page: Page) -> None:
    page.clock.install()  # the page's clock: the token's expiry is judged in the browser, as in Entra
    sign_in(page, fleet.console_url, "Operator")
    assert page.locator("#notice").inner_text() == ""
    page.clock.fast_forward("02:00:00")  # past the access token's hour (no refresh token is issued)
    page.locator("#notice", has_text="sign in again").wait_for(timeout=20_000)
    assert page.get_by_role("button", name="Sign in again").is_visible()
    assert "not refreshing" in page.locator("#age").inner_text()


def test_the_three_views_have_no_serious_accessibility_violation(fleet: Fleet, page: Page) -> None:
    event = held_event(fleet, ["vm-c"])
    sign_in(page, fleet.console_url, "Operator")
    found: Dict[str, Any] = {}
    views = (("#pending", "Pending"), ("#fleet", "Fleet"), (f"#event={event['eventId']}", "Freeze"))
    for view, heading in views:
        page.goto(fleet.console_url + view)
        page.locator("#view h1", has_text=heading).wait_for(timeout=20_000)
        found[view] = axe_serious(page)
    assert found == {view: [] for view in found}


def test_first_load_weight_is_measured(fleet: Fleet, page: Page) -> None:
    """Bytes transferred on the first load of a signed-in view (navigation + every resource + API
    calls), from the browser's Resource Timing: a figure for the docs, kept in artefacts/weight.json."""
    sign_in(page, fleet.console_url, "Reader")
    page.wait_for_timeout(500)
    entries = page.evaluate("performance.getEntriesByType('navigation').concat("
                            "performance.getEntriesByType('resource')).map(e => ({name: e.name, "
                            "transfer: e.transferSize, body: e.encodedBodySize}))")
    total = sum(e["transfer"] for e in entries)
    # msal-browser alone is ~310 KB: the figure counts it; a budget keeps the page from growing unseen
    assert 300_000 < total < 420_000, total
    ARTEFACTS.mkdir(exist_ok=True)
    figures = {"totalTransferBytes": total, "entries": entries}
    (ARTEFACTS / "weight.json").write_text(json.dumps(figures, indent=1))
    print(f"console first load: {total} bytes transferred in {len(entries)} requests")


def test_the_terminal_reads_and_decides_with_the_same_sign_in(fleet: Fleet,
                                                              capsys: pytest.CaptureFixture) -> None:
    """se-fleet pending / show / hold / release / approve against the same central, with the Operator's and
    the Reader's tokens; exit codes as documented (central/cli/se_fleet_events.py)."""
    from central.cli import se_fleet

    event = held_event(fleet, ["vm-c"])
    # the platform's authentication is off: the refusal without a token is central's own (a JSON body)
    anonymous = requests.get(f"{fleet.runner_url}/api/events/pending", timeout=10)
    assert anonymous.status_code == 401 and anonymous.json()["error"].startswith("sign in")
    base = ["--url", fleet.runner_url, "--token"]
    operator, reader = fleet.tokens["Operator"], fleet.tokens["Reader"]
    assert se_fleet.main(["pending", *base, reader]) == 0
    listed = capsys.readouterr().out
    assert event["eventId"] in listed and "why: rule db-needs-a-person" in listed
    assert se_fleet.main(["approve", event["eventId"], "--reason", "no", *base, reader]) == 4  # 403
    assert "Operator" in capsys.readouterr().err
    assert se_fleet.main(["release", event["eventId"], "--reason", "not held", *base, operator]) == 7
    assert "no operator holds it" in capsys.readouterr().err
    assert se_fleet.main(["hold", event["eventId"].lower(), "--reason", "wait for the app team", *base,
                          operator]) == 0
    assert "is now held" in capsys.readouterr().out
    assert se_fleet.main(["approve", event["eventId"], "--reason", "terminal test", *base, operator]) == 0
    assert "recorded as operator:olga.operator@contoso.com" in capsys.readouterr().out
    wait(lambda: fleet.imds.event(event["eventId"])["approvedBy"], 60, "the VM's approval reaches IMDS")
    assert se_fleet.main(["show", event["eventId"], *base, reader]) == 0
    story = capsys.readouterr().out
    assert "wait for the app team" in story and "terminal test" in story
    assert se_fleet.main(["show", "00000000-0000-0000-0000-00000000dead", *base, reader]) == 6
    assert se_fleet.main(["approve", event["eventId"], *base, operator]) == 3  # --reason is required
