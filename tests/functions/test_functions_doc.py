"""docs/functions.md's "Functions" table is the app's: every function function_app.py registers is listed,
with its trigger type and, for HTTP, its method and route; nothing else is listed. The operator actions named
there are those the `decide` function accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Tuple

from central.policy.operator_verdicts import OPERATOR_ACTIONS
from tests.functions.test_function_app import triggers

DOC = Path(__file__).resolve().parents[2] / "docs" / "functions.md"
KINDS = {"Event Hubs": "eventHubTrigger", "Timer": "timerTrigger", "HTTP": "httpTrigger"}


def documented() -> Dict[str, Tuple[str, str]]:
    """name -> (trigger type, "METHOD /api/route" or "") from the table under "## Functions"."""
    section = DOC.read_text().split("\n## Functions\n", 1)[1].split("\n### ", 1)[0]
    rows: Dict[str, Tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0]) if len(cells) >= 3 else None
        if not name:
            continue
        kind = next(k for k in KINDS if cells[1].startswith(k))
        route = re.match(r"HTTP `([A-Z]+ /api/[^`]+)`", cells[1])
        rows[name.group(1)] = (KINDS[kind], route.group(1) if route else "")
    return rows


def test_the_doc_lists_exactly_the_apps_functions_with_their_triggers_and_routes() -> None:
    actual = {name: (t["type"], f"{t['methods'][0]} /api/{t['route']}" if t["type"] == "httpTrigger" else "")
              for name, t in triggers().items()}
    assert len(actual) == 11
    assert documented() == actual


def test_the_doc_names_every_operator_action() -> None:
    text = DOC.read_text()
    actions = "{" + "|".join(OPERATOR_ACTIONS) + "}"  # what the decide function accepts, as the doc writes it
    assert f"POST /api/events/{{event_id}}/{actions}" in text
    # the two ways to decide: a signed-in Operator, or an integration's named key
    assert "### Signed-in operators" in text and "### Keys for automation, named" in text
