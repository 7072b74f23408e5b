"""Headless Chromium (Debian's package) driven by Playwright for Python, for the console's tests.

Playwright's own browser download is not used: `executable_path` is the system's Chromium. A missing
browser fails the test loudly (never a skip): `apt-get install chromium chromium-driver` (.ci/run does)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Dict, List

import pytest

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTEFACTS = Path(__file__).resolve().parent / "artefacts"  # screenshots and figures (gitignored)
AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"


def chromium_path() -> str:
    found = next((p for p in CHROMIUM_CANDIDATES if Path(p).exists()), None) or shutil.which("chromium")
    if not found:
        pytest.fail("Chromium is not installed: apt-get install -y chromium chromium-driver "
                    "(.ci/run installs it); the console's browser tests cannot run without it")
    return found


def sign_in(page: Any, console_url: str, role: str) -> None:
    """Open the console, press Sign in, pick `role`'s person on the issuer's page, wait for the view."""
    page.goto(console_url)
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.wait_for_url(re.compile(r"/oauth2/v2\.0/authorize"), timeout=20_000)
    page.get_by_role("button", name=re.compile(rf"\({role}\)")).click()
    page.wait_for_url(re.compile(r"/api/console/"), timeout=20_000)
    page.locator("#view h1").wait_for(timeout=20_000)


def axe_serious(page: Any) -> List[Dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is (run through the DevTools
    protocol, so the page's CSP is not loosened to let it in)."""
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run `npm ci` (axe-core is pinned in package.json)")
    page.evaluate(AXE.read_text(encoding="utf-8"))
    result = page.evaluate("async () => (await axe.run(document)).violations"
                           ".map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.length}))")
    return [v for v in result if v["impact"] in ("serious", "critical")]
