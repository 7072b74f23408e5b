"""tools/bicep_types.py: infra/'s resources against the bicep-types reference (../shared/bicep-types, beside
the checkout, never copied in): infra/ has no finding, and each rule is shown to catch a broken snippet."""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from tools import policy_reference
from tools.bicep_types import check_tree, main

REPO = Path(__file__).resolve().parents[2]
TYPES = REPO.parent / "shared" / "bicep-types"

pytestmark = pytest.mark.skipif(not (TYPES / "index.json").exists(),
                                reason="the bicep-types reference is not on this machine")

TOPIC = """
resource topic 'Microsoft.EventGrid/systemTopics@2025-02-15' = {
  name: 'maint'
  location: 'global'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: subscription().id
    topicType: 'Microsoft.ResourceNotifications.MaintenanceResources'
  }
}
"""


def _findings(tmp_path: Path, text: str) -> List[str]:
    (tmp_path / "main.bicep").write_text(text)
    return [f.message for f in check_tree(tmp_path, TYPES)]


def _policy_types() -> Path:
    """The policy types the shared extract lacks (infra/coverage/): tools/policy_reference.py's cache. Like
    the shared extract itself, reference data no registry serves: absent on a machine, the check is skipped
    with this reason in the summary (-ra), never passed."""
    cache = policy_reference.cache_dir()
    if policy_reference.missing(cache):
        pytest.skip(f"no policy types in {cache} on this machine: infra/coverage's types are unchecked; "
                    "fill it with `python -m tools.policy_reference fill "
                    "--types-git <Azure/bicep-types-az git dir> "
                    "--aliases-git <maciejporebski/azure-policy-aliases git dir>` (docs/deploy.md)")
    return cache / "bicep-types"


def test_infra_fits_the_reference() -> None:
    """Every Bicep file but the policy initiative's, against the shared extract alone."""
    findings = [f for f in check_tree(REPO / "infra", TYPES) if "infra/coverage/" not in str(f)]
    assert findings == [], "\n".join(map(str, findings))


def test_the_policy_initiative_fits_the_reference() -> None:
    findings = check_tree(REPO / "infra" / "coverage", TYPES, _policy_types())
    assert findings == [], "\n".join(map(str, findings))


def test_without_the_policy_types_the_initiative_is_a_finding_not_a_pass() -> None:
    """Runs on every machine: a policy type the shared extract lacks is named, never passed over."""
    found = [f.message for f in check_tree(REPO / "infra" / "coverage", TYPES)]
    assert any("policyAssignments@2025-03-01 is not in the reference types" in f for f in found)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(REPO / "infra" / "app"), str(TYPES)]) == 0
    assert main([str(REPO / "infra"), str(tmp_path)]) == 3  # no reference there: one line, not a traceback
    assert "no index.json" in capsys.readouterr().err
    (tmp_path / "main.bicep").write_text("resource r 'Microsoft.Nope/things@2020-01-01' = {\n"
                                         "  name: 'r'\n}\n")
    assert main([str(tmp_path), str(TYPES)]) == 1


def test_a_correct_resource_has_no_finding(tmp_path: Path) -> None:
    assert _findings(tmp_path, TOPIC) == []


def test_a_type_or_version_not_in_the_reference(tmp_path: Path) -> None:
    found = _findings(tmp_path, TOPIC.replace("@2025-02-15", "@2025-07-15-preview"))
    assert found == ["topic: Microsoft.EventGrid/systemTopics@2025-07-15-preview is not in the reference "
                     "types"]


def test_a_resource_group_type_at_subscription_scope(tmp_path: Path) -> None:
    found = _findings(tmp_path, "targetScope = 'subscription'\n" + TOPIC)
    assert found == ["topic: Microsoft.EventGrid/systemTopics@2025-02-15 cannot be deployed at subscription "
                     "scope (put it in a module scoped to a resource group)"]


def test_an_unknown_property_is_named_with_its_path(tmp_path: Path) -> None:
    found = _findings(tmp_path, TOPIC.replace("topicType:", "topicTyp:"))
    assert len(found) == 1 and found[0].startswith("topic.properties.topicTyp: SystemTopicProperties has no "
                                                   "property 'topicTyp'")


def test_a_read_only_property(tmp_path: Path) -> None:
    found = _findings(tmp_path, TOPIC.replace("source:", "metricResourceId: 'x'\n    source:"))
    assert found == ["topic.properties.metricResourceId: read-only in SystemTopicProperties"]


def test_an_undocumented_value_and_a_wrong_kind(tmp_path: Path) -> None:
    broken = TOPIC.replace("'SystemAssigned'", "'SystemAsigned'").replace("'global'", "true")
    found = _findings(tmp_path, broken)
    assert sorted(found) == sorted([
        "topic.location: expected a string, got bool",
        "topic.identity.type: 'SystemAsigned' is not one of the documented 'None', 'SystemAssigned', "
        "'UserAssigned', 'SystemAssigned, UserAssigned'",
    ])


def test_discriminated_objects_and_required_properties(tmp_path: Path) -> None:
    text = TOPIC + """
resource sub 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15' = {
  parent: topic
  name: 'to-hub'
  properties: {
    deliveryWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      destination: {
        endpointType: 'EventHub'
        properties: {
          resourceId: 'x'
          queueName: 'no'
        }
      }
    }
    eventDeliverySchema: cond ? 'EventGridSchema' : 'EventGridSchemaV2'
  }
}
param cond bool
"""
    found = _findings(tmp_path, text)
    assert found[0].startswith("sub.properties.deliveryWithResourceIdentity.destination.properties."
                               "queueName: EventHubEventSubscriptionDestinationProperties has no property "
                               "'queueName'")
    assert found[1].startswith("sub.properties.eventDeliverySchema: 'EventGridSchemaV2' is not one of")
    assert len(found) == 2
    found = _findings(tmp_path, text.replace("'EventHub'", "'EventHubs'"))
    assert found[0].startswith("sub.properties.deliveryWithResourceIdentity.destination.endpointType: "
                               "'EventHubs' is not one of 'AzureFunction', 'EventHub',")
    missing = _findings(tmp_path, TOPIC.replace("  name: 'maint'\n", ""))
    assert missing == ["topic: Microsoft.EventGrid/systemTopics requires 'name'"]
