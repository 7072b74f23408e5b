"""Matching semantics: one wildcard rule in every match field, resource group and subscription from
the resourceId, fleet-wide and percentage budgets, and the lint that finds rules that cannot work."""

from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from central.model.vms import VmState
from central.policy import budgets, matching
from central.policy import document as policy
from central.policy import lint as policy_lint

RID = "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/web"
WEB = VmState(
    "id-web",
    "web_0",
    resource_id=RID.format(sub="SUB-1111", rg="rg-prod-web"),
    scale_set="web",
    placement_group="9f3c-pg",
    zone="2",
    tags={"role": "web", "env": "Prod"},
)
SOLO = VmState(
    "id-solo",
    "solo1",
    resource_id="/subscriptions/sub-2222/resourceGroups/RG-Dev/providers/"
    "Microsoft.Compute/virtualMachines/solo1",
    tags={"role": "db"},
)


def fits(match: Dict[str, Any], vm: VmState, event_type: str = "Reboot") -> bool:
    return matching.fits(match, event_type, "Platform", -1, [vm])


@pytest.mark.parametrize("key", list(matching.NAME_KEYS))
def test_star_in_every_name_field_fits_a_vm_that_has_a_value_and_no_other(key: str) -> None:
    assert fits({key: ["*"]}, WEB)
    standalone = VmState("id-x", "x")  # no scale set, placement group, zone or resourceId
    expected = key == "vmNames"  # every VM has a name
    assert fits({key: ["*"]}, standalone) is expected


@pytest.mark.parametrize(
    "key, pattern, other",
    [
        ("vmNames", "WEB_?", "db_?"),
        ("scaleSets", "W*", "api*"),
        ("placementGroups", "9F3C-*", "0000-*"),
        ("zones", "[12]", "[3]"),
        ("resourceGroups", "rg-PROD-*", "rg-dev-*"),
        ("subscriptions", "sub-11*", "sub-22*"),
    ],
)
def test_every_name_field_takes_the_same_case_insensitive_patterns(
    key: str, pattern: str, other: str
) -> None:
    assert fits({key: [other, pattern]}, WEB)
    assert not fits({key: [other]}, WEB)


def test_tag_values_take_the_same_patterns_case_sensitively() -> None:
    assert fits({"tags": {"env": "Pr*"}}, WEB)
    assert fits({"tags": {"env": ["dev", "P[r]od"]}}, WEB)
    assert not fits({"tags": {"env": "prod"}}, WEB)  # tag values keep their case, as in Azure
    assert fits({"tags": {"env": "*"}}, WEB)
    assert not fits({"tags": {"owner": "*"}}, WEB)  # "*" needs the tag to be present


def test_resource_group_and_subscription_come_from_the_resource_id() -> None:
    assert matching.resource_group_of(WEB) == "rg-prod-web"
    assert matching.subscription_of(SOLO) == "sub-2222"
    assert matching.resource_group_of(VmState("i", "n", resource_id="garbage")) == ""
    assert fits({"resourceGroups": ["rg-dev"], "subscriptions": ["SUB-2222"]}, SOLO)
    assert not fits({"resourceGroups": ["rg-dev"], "subscriptions": ["sub-1111"]}, SOLO)


def test_version_1_scale_set_match_keeps_its_meaning() -> None:
    """Before: exact, case-insensitive compare. Names without wildcards still mean exactly that."""
    assert fits({"scaleSets": ["WEB"]}, WEB)
    assert not fits({"scaleSets": ["we"]}, WEB)
    assert not fits({"scaleSets": ["web"]}, SOLO)


def test_vm_conditions_must_all_hold_on_one_vm() -> None:
    both = {"tags": {"role": "db"}, "scaleSets": ["web"]}
    assert not matching.fits(both, "Reboot", "Platform", -1, [WEB, SOLO])  # each fits only half
    assert matching.fits({"tags": {"role": "db"}}, "Reboot", "Platform", -1, [WEB, SOLO])


def test_misses_name_each_failed_condition_per_vm() -> None:
    found = matching.misses({"eventTypes": ["Redeploy"], "zones": ["1"]}, "Reboot", "Platform", -1, [WEB])
    assert [(m.key, m.got, m.vm) for m in found] == [("eventTypes", "Reboot", None), ("zones", "2", "web_0")]
    none_known = matching.misses({"zones": ["1"]}, "Reboot", "Platform", -1, [])
    assert [m.key for m in none_known] == ["vms"]
    assert matching.misses({"zones": ["2"]}, "Reboot", "Platform", -1, [SOLO, WEB]) == []


def _budget(**doc: Any) -> policy.Budget:
    p = policy.load(json.dumps({"version": 1, "budgets": {"b": doc}}))
    return p.budgets["b"]


def test_percentage_budget_limit_rounds_down_and_never_below_one() -> None:
    b = _budget(groupBy="scaleSet", maxImpactedPercent=25)
    assert [budgets.budget_limit(b, n) for n in (1, 3, 4, 8, 10, 100)] == [1, 1, 1, 2, 2, 25]
    assert b.limit(40) == 10
    assert b.max_impacted == 1  # what code that does not know percentages reads: the safe floor
    counted = _budget(groupBy="zone", maxImpacted=3)
    assert budgets.budget_limit(counted, 100) == 3


def _vm(i: int, scale_set: str = "web") -> VmState:
    return VmState(f"id-{i}", f"{scale_set}_{i}", scale_set=scale_set)


def test_fleet_wide_budget_counts_every_known_vm_as_one_group() -> None:
    b = _budget(groupBy="fleet", maxImpactedPercent=10)
    fleet_vms = [_vm(i, "web") for i in range(10)] + [_vm(i, "api") for i in range(10, 20)]
    assert b.group_of(fleet_vms[0]) == b.group_of(fleet_vms[15]) == "b:fleet"
    state = budgets.FleetState(fleet_vms, impacted_vms=[fleet_vms[15]])
    assert budgets.budget_block([b], [fleet_vms[0]], state) is None  # 2 of 20 = the limit 2
    state = budgets.FleetState(fleet_vms, impacted_vms=[fleet_vms[15], fleet_vms[16]])
    block = budgets.budget_block([b], [fleet_vms[0]], state)
    assert block is not None and (block.busy, block.mine, block.limit, block.group_size) == (2, 1, 2, 20)
    assert "2 VM(s) of b:fleet already impacted" in block.reason()


def test_percentage_budget_is_per_group() -> None:
    b = _budget(groupBy="scaleSet", maxImpactedPercent=50)
    web = [_vm(i, "web") for i in range(4)]
    api = [_vm(i, "api") for i in range(4, 6)]
    state = budgets.FleetState(web + api, impacted_vms=[web[1], api[4 - 4]])
    assert budgets.budget_block([b], [web[0]], state) is None  # web: 1 busy + 1 <= 2
    block = budgets.budget_block([b], [api[1]], state)  # api: 1 busy + 1 > 1 (50 % of 2)
    assert block is not None and block.group == "b:api" and block.limit == 1


def _load(rules: Any, **extra: Any) -> policy.Policy:
    return policy.load(json.dumps({"version": 1, "rules": rules, **extra}))


@pytest.mark.parametrize(
    "first, second, shadowed",
    [
        ({}, {"eventTypes": ["Reboot"]}, True),
        ({"eventTypes": ["Reboot", "Redeploy"]}, {"eventTypes": ["Reboot"]}, True),
        ({"eventTypes": ["Reboot"]}, {"eventTypes": ["Reboot", "Redeploy"]}, False),
        ({"scaleSets": ["*"]}, {"scaleSets": ["web"], "eventTypes": ["Freeze"]}, True),
        ({"scaleSets": ["web-*"]}, {"scaleSets": ["web-1", "web-2"]}, True),
        ({"scaleSets": ["web-*"]}, {"scaleSets": ["web-1", "api"]}, False),
        ({"scaleSets": ["*"]}, {}, False),  # the later rule also fits events with no known VM
        ({"tags": {"role": "*"}}, {"tags": {"role": "db", "env": "prod"}}, True),
        ({"tags": {"role": "db"}}, {"tags": {"role": "d*"}}, False),
        ({"durationInSeconds": {"min": 0, "max": 30}}, {"durationInSeconds": {"min": 0, "max": 9}}, True),
        ({"durationInSeconds": {"min": 0, "max": 9}}, {"durationInSeconds": {"min": 0, "max": 30}}, False),
        ({"durationInSeconds": {"min": 0}}, {}, False),  # -1 (unknown) is below min 0
        ({"resourceGroups": ["rg-*"]}, {"resourceGroups": ["RG-prod"], "zones": ["1"]}, True),
    ],
)
def test_lint_finds_rules_an_earlier_rule_shadows(first: Any, second: Any, shadowed: bool) -> None:
    p = _load(
        [{"name": "a", "match": first, "action": "hold"}, {"name": "b", "match": second, "action": "approve"}]
    )
    found = [f for f in policy_lint.lint(p) if f.code == "shadowed-rule"]
    assert bool(found) is shadowed
    if shadowed:
        assert found[0].path == "/rules/1" and found[0].severity == "error"


def test_window_longest_closed_stretch() -> None:
    p = _load(
        [],
        windows={
            "nightly": {"start": "22:00", "end": "04:00"},
            "weekend": {"days": ["Sat", "Sun"], "start": "00:00", "end": "24:00"},
            "always": {"start": "00:00", "end": "24:00"},
        },
    )
    assert policy_lint.longest_closed_minutes(p.windows["nightly"]) == 18 * 60
    assert policy_lint.longest_closed_minutes(p.windows["weekend"]) == 5 * 24 * 60
    assert policy_lint.longest_closed_minutes(p.windows["always"]) == 0


def test_window_rule_is_flagged_for_types_whose_notice_is_shorter_than_the_closed_stretch() -> None:
    windows = {"w": {"start": "00:00", "end": "23:50"}}  # closed 10 min a day
    rules = [
        {
            "name": "r",
            "match": {"eventTypes": ["Freeze", "Redeploy", "Preempt"]},
            "action": "approve-in-window",
            "window": "w",
        }
    ]
    found = [f for f in policy_lint.lint(_load(rules, windows=windows)) if f.code == "window-after-notice"]
    assert len(found) == 1 and found[0].severity == "warning" and found[0].path == "/rules/0/window"
    assert "Preempt 30 s" in found[0].message
    assert "Freeze" not in found[0].message and "Redeploy" not in found[0].message  # 10 min is not > 10 min


def test_load_reports_schema_and_semantic_errors_together_and_bounded() -> None:
    doc = {"version": 1, "windows": {"w": {"start": "2:00", "end": "04:00", "timeZone": "Europe/Olso"}}}
    with pytest.raises(policy.PolicyError) as info:
        policy.load(json.dumps(doc))
    assert [e["path"] for e in info.value.errors] == ["/windows/w/start", "/windows/w/timeZone"]
    many = {"version": 1, "rules": [{"name": f"r{i}", "action": "nope"} for i in range(100)]}
    with pytest.raises(policy.PolicyError) as info:
        policy.load(json.dumps(many))
    assert len(info.value.errors) == policy.MAX_ERRORS + 1
    assert info.value.errors[-1]["message"] == "... and 80 more (se-policy check)"
