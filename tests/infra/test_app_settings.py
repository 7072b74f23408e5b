"""One list of app setting names: central/app_settings.json. The Function app's Bicep sets exactly
those names, and every setting function_app.py's bindings read (%NAME% and connection prefixes) is in it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List

from tools.bicep_settings import (
    app_settings_findings,
    binding_setting_refs,
    load_json_targets,
    object_var_keys,
)

REPO = Path(__file__).resolve().parents[2]
FUNCTION_BICEP = REPO / "infra" / "app" / "function.bicep"
SETTINGS_JSON = REPO / "central" / "app_settings.json"


def _listed() -> set:
    return set(json.loads(SETTINGS_JSON.read_text())["settings"])


def _bindings() -> List[Dict[str, Any]]:
    # The loader indexes the FunctionApp once per process (a second get_functions() raises).
    from sandbox.functions.loader import load_functions

    return [binding for spec in load_functions("function_app") for binding in spec.bindings]


def test_the_bicep_reads_the_central_list() -> None:
    assert SETTINGS_JSON.resolve() in load_json_targets(FUNCTION_BICEP)


def test_bicep_sets_exactly_the_listed_names_and_bindings_read_only_listed_ones() -> None:
    refs = binding_setting_refs(_bindings())
    assert refs["names"], "the bindings read at least the hub and schedule settings"
    problems = app_settings_findings(object_var_keys(FUNCTION_BICEP, "appSettingValues"), _listed(), refs)
    assert problems == []


def test_a_setting_missing_from_the_bicep_is_caught(tmp_path: Path) -> None:
    text = FUNCTION_BICEP.read_text()
    assert "  TABLE_PREFIX: tablePrefix\n" in text
    broken = tmp_path / "function.bicep"
    broken.write_text(text.replace("  TABLE_PREFIX: tablePrefix\n", "  TABLE_PREFX: tablePrefix\n"))
    problems = app_settings_findings(object_var_keys(broken, "appSettingValues"), _listed(), {})
    assert any("'TABLE_PREFIX'" in p for p in problems) and any("'TABLE_PREFX'" in p for p in problems)


def test_a_binding_reading_an_unlisted_setting_is_caught() -> None:
    bindings = [{"type": "eventHubTrigger", "eventHubName": "%EVENT_HUB%", "connection": "OtherConnection"}]
    problems = app_settings_findings(_listed(), _listed(), binding_setting_refs(bindings))
    assert any("%EVENT_HUB%" in p for p in problems)
    assert any("'OtherConnection'" in p for p in problems)


def test_the_arm_api_version_and_the_hook_timeout_are_parameters_so_a_change_survives_a_deployment() -> None:
    """Infra writes every app setting on each deployment: a value changed by hand in the portal is undone, so
    a setting an operator must be able to change (ARM's api-version for a lagging region, the drain timeout
    raised with the forwarder's hook_timeout) comes from a main.bicep parameter, not a literal."""
    function = (REPO / "infra" / "app" / "function.bicep").read_text()
    main = (REPO / "infra" / "main.bicep").read_text()
    for setting, param in (("ARM_API_VERSION", "armApiVersion"),
                           ("APPROVAL_HOOK_RESULT_TIMEOUT_SECONDS", "approvalHookResultTimeoutSeconds")):
        assert re.search(rf"^\s*{setting}: (string\()?{param}\)?$", function, re.M), setting
        assert re.search(rf"^param {param} ", main, re.M) and f"{param}: {param}" in main, param
