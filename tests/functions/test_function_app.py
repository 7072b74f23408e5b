"""function_app.py as the host indexes it, and its setting names against central/app_settings.json."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, Set

import pytest

from sandbox.functions.loader import load_functions

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = json.loads((REPO / "central" / "app_settings.json").read_text())
SETTINGS: Dict[str, str] = CATALOGUE["settings"]


# get_functions() indexes the app once (a second call raises, as in the worker): share the loader's index.
_FUNCTION_JSON = {
    spec.name: {"bindings": spec.bindings} for spec in load_functions("function_app")
}


def function_json() -> Dict[str, dict]:
    return _FUNCTION_JSON


def triggers() -> Dict[str, dict]:
    return {
        name: next(b for b in doc["bindings"] if b["type"].endswith("Trigger"))
        for name, doc in function_json().items()
    }


def expressions_used() -> Set[str]:
    """Every %NAME% in any binding property of function_app.py."""
    found: Set[str] = set()
    for doc in function_json().values():
        for binding in doc["bindings"]:
            for value in binding.values():
                if isinstance(value, str):
                    found |= set(re.findall(r"%([^%]+)%", value))
    return found


def connections_used() -> Set[str]:
    return {
        b["connection"] for doc in function_json().values() for b in doc["bindings"] if b.get("connection")
    }


def test_functions_and_their_trigger_types() -> None:
    assert {name: t["type"] for name, t in triggers().items()} == {
        "ingest": "eventHubTrigger",
        "platform": "eventHubTrigger",
        "reevaluate": "timerTrigger",
        "pending": "httpTrigger",
        "event": "httpTrigger",
        "decide": "httpTrigger",
        "decide_by_key": "httpTrigger",
        "fleet": "httpTrigger",
        "reverify": "httpTrigger",
        "health": "httpTrigger",
        "console": "httpTrigger",
    }


def test_event_hubs_trigger_takes_batches_from_settings() -> None:
    ingest = triggers()["ingest"]
    assert ingest["cardinality"].lower() == "many"
    assert ingest["eventHubName"] == "%EVENTHUB_NAME%"
    assert ingest["consumerGroup"] == "%EVENTHUB_CONSUMER_GROUP%"
    assert ingest["connection"] == CATALOGUE["eventHubConnectionPrefix"]


def test_timer_schedule_comes_from_a_setting() -> None:
    assert triggers()["reevaluate"]["schedule"] == "%REEVALUATE_SCHEDULE%"


def test_http_routes_methods_and_function_auth_level() -> None:
    routes = {
        name: (t["route"], tuple(t["methods"]), t["authLevel"].lower())
        for name, t in triggers().items()
        if t["type"] == "httpTrigger"
    }
    # The operators' routes are anonymous to the host: App Service authentication stands in front of them
    # and central checks the role. The two routes App Service authentication excludes keep a function key.
    assert routes == {
        "pending": ("events/pending", ("GET",), "anonymous"),
        "event": ("events/{event_id}", ("GET",), "anonymous"),
        "decide": ("events/{event_id}/{action}", ("POST",), "anonymous"),
        "decide_by_key": ("automation/events/{event_id}/{action}", ("POST",), "function"),
        "fleet": ("fleet", ("GET",), "anonymous"),
        "reverify": ("authn/reverify", ("POST",), "anonymous"),
        "health": ("health", ("GET",), "function"),
        "console": ("console/{*path}", ("GET",), "anonymous"),
    }


def test_only_key_guarded_routes_are_outside_sign_in_in_infra_and_the_sandbox() -> None:
    """A route excluded from App Service authentication and anonymous to the host would be open to all;
    the one exception is the console's static files (no data: its calls carry the person's token)."""
    from sandbox.functions.easyauth import EasyAuth
    from sandbox.functions.issuer import EXCLUDED_PATHS

    main = (REPO / "infra" / "main.bicep").read_text()
    block = re.search(r"excludedPaths: \[(.*?)\]", main, re.S)
    assert block, "infra/main.bicep passes excludedPaths to app/auth.bicep"
    assert re.findall(r"'([^']+)'", block.group(1)) == EXCLUDED_PATHS
    gate = EasyAuth(True, excluded_paths=EXCLUDED_PATHS)
    for name, trigger in triggers().items():
        if trigger["type"] != "httpTrigger":
            continue
        path = "/api/" + re.sub(r"\{[^}]+\}", "x", trigger["route"])
        if gate.excluded(path) and name != "console":
            assert trigger["authLevel"].lower() == "function", f"{name} is outside sign-in without a key"


def test_every_binding_expression_is_a_declared_app_setting() -> None:
    used = expressions_used()
    assert used, "function_app.py takes hub, consumer group and schedule from app settings"
    assert sorted(used - set(SETTINGS)) == []


@pytest.mark.parametrize("connection", sorted(connections_used()))
def test_every_binding_connection_is_a_declared_identity_based_prefix(connection: str) -> None:
    assert connection == CATALOGUE["eventHubConnectionPrefix"]
    assert f"{connection}__fullyQualifiedNamespace" in SETTINGS
    assert connection not in SETTINGS, "Azure uses the identity-based form, never a connection string"


def test_every_binding_related_app_setting_is_used_by_a_binding() -> None:
    """Vice versa: a declared setting nobody reads is a mistake infra would carry. Settings are read by
    the bindings (%NAME%, `PREFIX__*` of a binding connection) or by the central package itself."""
    central_source = "\n".join(p.read_text() for p in (REPO / "central").rglob("*.py"))
    storage = CATALOGUE["storageConnectionPrefix"]
    unused = []
    for name in SETTINGS:
        by_binding = name in expressions_used() or name.split("__")[0] in connections_used()
        by_central = name in central_source or (
            name.startswith(storage + "__") and f"__{name.split('__', 1)[1]}" in central_source
        )
        if not (by_binding or by_central):
            unused.append(name)
    assert unused == []
    assert {n for n in SETTINGS if n.startswith(CATALOGUE["eventHubConnectionPrefix"] + "__")} <= {
        f"{c}__{k}" for c in connections_used() for k in ("fullyQualifiedNamespace", "credential", "clientId")
    }


def test_settings_example_defines_every_binding_setting() -> None:
    example = json.loads((REPO / "local.settings.example.json").read_text())["Values"]
    assert sorted(expressions_used() - set(example)) == []
    assert all(c in example or f"{c}__fullyQualifiedNamespace" in example for c in connections_used())
    assert example["FUNCTIONS_WORKER_RUNTIME"] == "python"


def test_host_json_bundle_batches_and_retry() -> None:
    host = json.loads((REPO / "host.json").read_text())
    assert host["version"] == "2.0"
    assert host["extensionBundle"] == {
        "id": "Microsoft.Azure.Functions.ExtensionBundle",
        "version": "[4.*, 5.0.0)",
    }
    hubs = host["extensions"]["eventHubs"]
    assert {"maxEventBatchSize", "prefetchCount", "batchCheckpointFrequency"} <= set(hubs)
    assert host["retry"]["strategy"] in ("exponentialBackoff", "fixedDelay")


def test_funcignore_keeps_the_non_app_parts_out_of_the_package() -> None:
    ignored = {
        line.strip().rstrip("/")
        for line in (REPO / ".funcignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for part in ("forwarder", "tests", "sandbox", "bench", "infra", "node_modules", ".venv", "docs",
                 "examples"):
        assert part in ignored, f"{part} must not ship in the Function app package"
    for shipped in ("central", "schemas", "function_app.py", "host.json", "requirements.txt"):
        assert shipped not in ignored
