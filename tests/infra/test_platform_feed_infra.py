"""The platform feed's infrastructure (issue 23, point 5), read from the Bicep syntax trees:

- infra/app/platform-feed.bicep: the MaintenanceResources system topic (location global, source the
  subscription, system-assigned identity) unless an existing topic is named; one event subscription to the
  platform hub, delivered with the topic's identity, filtered to ScheduledEventEmitted (central's constant);
- infra/app/platform-sender.bicep: Azure Event Hubs Data Sender for that identity on the platform hub only;
- infra/main.bicep (subscription scope): one switch, off by default and saying why; the module scoped to a
  resource group (a system topic cannot be written at subscription scope); the outputs the install reads;
- no Scheduled Events Contributor anywhere in the Bicep: central gets it per resource from the install.
The types themselves are checked against the reference in test_bicep_types.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest
import tree_sitter as ts

from central.intake.platform import EMITTED
from tools.bicep_syntax import body_object, name_of, node_text, parse, string_value
from tools.bicep_types import EXPR, Either, literal

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
FEED = INFRA / "app" / "platform-feed.bicep"
SENDER = INFRA / "app" / "platform-sender.bicep"
MAIN = INFRA / "main.bicep"
BUILTIN = REPO.parent / "shared" / "bicep-types" / "builtin-roles.json"
DATA_SENDER = "2b629674-e913-4c01-ae53-ef4638d8f975"
SUBSCRIBER_ROLE = "0b962ed2-6d56-471c-bd5f-3477d83a7ba4"


def _declaration(path: Path, kind: str, name: str) -> ts.Node:
    for node in parse(path).root_node.children:
        if node.type == kind and name_of(node) == name:
            return node
    raise AssertionError(f"no {kind} {name} in {path.name}")


def _resource(path: Path, name: str) -> Dict[str, Any]:
    node = _declaration(path, "resource_declaration", name)
    body = body_object(node)
    assert body is not None
    value = literal(body)
    value["@type"] = next(string_value(c) for c in node.children if c.type == "string")
    value["@source"] = node_text(node)
    return value


def test_the_system_topic_is_subscription_wide_global_and_has_its_own_identity() -> None:
    topic = _resource(FEED, "newTopic")
    assert topic["@type"] == "Microsoft.EventGrid/systemTopics@2025-02-15"
    assert topic["location"] == "global"
    assert topic["identity"] == {"type": "SystemAssigned"}
    assert topic["properties"]["topicType"] == "Microsoft.ResourceNotifications.MaintenanceResources"
    assert "source: subscription().id" in topic["@source"]
    # Created only when no existing topic is named (Azure allows one per subscription).
    assert "= if (createTopic) {" in topic["@source"]
    assert "var createTopic = empty(existingTopicName)" in FEED.read_text()


def test_an_existing_topic_gets_only_the_event_subscription() -> None:
    topic = _resource(FEED, "topic")
    assert topic["@type"] == "Microsoft.EventGrid/systemTopics@2025-02-15"
    assert "existing = {" in topic["@source"] and "name: topicName" in topic["@source"]
    assert "var topicName = createTopic ? newTopicName : existingTopicName" in FEED.read_text()
    subscription = _resource(FEED, "toPlatformHub")
    assert "parent: topic\n" in subscription["@source"]  # the existing-or-created topic, by name
    # Its identity: the new topic's, or the existing one's (read only when it existed).
    sender = node_text(_declaration(FEED, "module_declaration", "sender"))
    assert ("topicPrincipalId: createTopic ? newTopic!.identity.principalId : topic.identity.principalId"
            in sender)


def test_the_event_subscription_delivers_to_the_platform_hub_with_the_topics_identity() -> None:
    subscription = _resource(FEED, "toPlatformHub")
    assert subscription["@type"] == "Microsoft.EventGrid/systemTopics/eventSubscriptions@2025-02-15"
    props = subscription["properties"]
    assert "destination" not in props  # no key-based or Event Grid-identity delivery
    delivery = props["deliveryWithResourceIdentity"]
    assert delivery["identity"] == {"type": "SystemAssigned"}
    assert delivery["destination"]["endpointType"] == "EventHub"
    assert "resourceId: platformHubId" in subscription["@source"]
    assert delivery["destination"]["properties"]["deliveryAttributeMappings"] == [
        {"name": "PartitionKey", "type": "Dynamic", "properties": {"sourceField": "data.resourceInfo.name"}}]
    assert props["eventDeliverySchema"] == "EventGridSchema"
    # The role exists before Event Grid is asked to deliver.
    assert "dependsOn: [\n    sender\n  ]" in subscription["@source"]


def test_the_filter_is_the_event_type_central_reads() -> None:
    subscription = _resource(FEED, "toPlatformHub")
    assert subscription["properties"]["filter"]["includedEventTypes"] is not None
    text = FEED.read_text()
    assert f"var emittedType = '{EMITTED}'" in text
    assert "includedEventTypes: [\n        emittedType\n      ]" in text
    assert EMITTED == "Microsoft.ResourceNotifications.MaintenanceResources.ScheduledEventEmitted"


def test_the_topic_may_send_to_the_platform_hub_and_nowhere_else() -> None:
    assignment = _resource(SENDER, "topicSender")
    assert assignment["@type"] == "Microsoft.Authorization/roleAssignments@2022-04-01"
    assert "scope: platformHub\n" in assignment["@source"]
    assert assignment["properties"]["principalType"] == "ServicePrincipal"
    assert "principalId: topicPrincipalId" in assignment["@source"]
    hub = _resource(SENDER, "platformHub")
    assert hub["@type"].startswith("Microsoft.EventHub/namespaces/eventhubs@")  # the hub, not the namespace
    assert f"var eventHubsDataSender = '{DATA_SENDER}' // Azure Event Hubs Data Sender" in SENDER.read_text()
    # The feed module passes the platform hub, the one main.bicep names <hub>-platform.
    module = node_text(_declaration(MAIN, "module_declaration", "platformFeed"))
    assert "platformHubId: eventHubs.outputs.platformHubId" in module
    assert "output platformHubId string = platformHub.id" in (INFRA / "app" / "eventhubs.bicep").read_text()


@pytest.mark.skipif(not BUILTIN.exists(), reason="the reference built-in roles list is not on this machine")
def test_role_ids_are_the_builtin_ones() -> None:
    roles = json.loads(BUILTIN.read_text())["roles"]
    assert roles[DATA_SENDER]["roleName"] == "Azure Event Hubs Data Sender"
    assert roles[SUBSCRIBER_ROLE]["roleName"] == "Azure Resource Notifications System Topics Subscriber"


def test_one_switch_off_by_default_and_it_says_preview() -> None:
    text = MAIN.read_text()
    assert "targetScope = 'subscription'" in text
    declaration = _declaration(MAIN, "parameter_declaration", "platformFeedEnabled")
    assert node_text(declaration) == "param platformFeedEnabled bool = false"
    decorators = node_text(declaration.prev_sibling)
    assert "PREVIEW" in decorators and "not recommended for production" in decorators
    module = _declaration(MAIN, "module_declaration", "platformFeed")
    source = node_text(module)
    assert "= if (platformFeedEnabled) {" in source
    assert "scope: resourceGroup(empty(platformSystemTopicResourceGroup) ? rg.name : " \
           "platformSystemTopicResourceGroup)" in source
    assert "existingTopicName: platformSystemTopicName" in source
    assert "param platformSystemTopicName string = ''" in text
    # PLATFORM_CONFIRM_SCOPES follows the switch: no scope is confirmed against a feed that is off.
    assert "platformConfirmScopes: platformFeedEnabled ? platformConfirmScopes : ''" in text


def test_the_outputs_the_install_reads() -> None:
    text = MAIN.read_text()
    assert "output FUNCTION_PRINCIPAL_ID string = identities.outputs.functionIdentityPrincipalId" in text
    assert "output PLATFORM_FEED_ENABLED bool = platformFeedEnabled" in text
    install = (INFRA / "forwarder" / "install-on-vms.sh").read_text()
    assert "KEYS+=(FUNCTION_PRINCIPAL_ID)" in install and "OPTIONAL_KEYS=(PLATFORM_FEED_ENABLED)" in install


def test_no_bicep_grants_scheduled_events_contributor() -> None:
    # Central gets it per VM / scale set / availability set from the install (or infra/coverage/'s per-owner
    # policy, tests/infra/test_coverage_policy.py), never in a wide scope here. infra/coverage/ names it only
    # in the condition that limits which roles remediation may grant.
    for path in INFRA.rglob("*.bicep"):
        guid = "b67fe603-310e-4889-b9ee-8257d09d353d"
        lines = [line for line in path.read_text().splitlines() if guid in line]
        assert not lines or (path.parent.name == "coverage" and
                             all(line.startswith("var grantable = ") for line in lines)), path


def test_literal_reading_of_expressions() -> None:
    # The helper this file leans on: expressions stay expressions, ternaries keep both branches.
    tree = parse(FEED)
    node = next(n for n in tree.root_node.children
                if n.type == "resource_declaration" and name_of(n) == "newTopic")
    value = literal(body_object(node))
    assert value["name"] is EXPR and value["tags"] is EXPR
    assert isinstance(literal(_ternary()), Either)


def _ternary() -> ts.Node:
    tree = parse(MAIN)
    for node in tree.root_node.children:
        if node.type == "variable_declaration" and name_of(node) == "storageSku":
            return node.children[-1]
    raise AssertionError("no var storageSku")


def test_the_parameter_file_keeps_the_feed_off_unless_asked() -> None:
    text = (INFRA / "main.bicepparam").read_text()
    assert ("param platformFeedEnabled = toLower(readEnvironmentVariable('SE_PLATFORM_FEED', 'false'))"
            " == 'true'" in text)
    for name, variable in (("platformSystemTopicName", "SE_PLATFORM_SYSTEM_TOPIC"),
                           ("platformSystemTopicResourceGroup", "SE_PLATFORM_SYSTEM_TOPIC_RG"),
                           ("platformConfirmScopes", "SE_PLATFORM_CONFIRM_SCOPES")):
        assert f"param {name} = readEnvironmentVariable('{variable}', '')" in text
