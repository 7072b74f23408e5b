"""Regions: `location` accepts exactly the regions that offer Flex Consumption (any other is refused
before anything is created), azd prompts with its location picker, and the one region table
(main.bicep's zoneRedundantByRegion) decides storage redundancy and Event Hubs zone redundancy, so
every allowed region deploys with the defaults.

Facts checked 2026-11-24 (recorded beside the table in main.bicep): the regions are the @allowed list of
Microsoft's Flex Consumption azd sample (Azure-Samples/functions-quickstart-python-http-azd,
infra/main.bicep); of those, Standard_ZRS is missing in the regions below
(learn.microsoft.com/azure/storage/common/redundancy-regions-zrs, "Standard storage accounts").
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from tools.bicep_check import body_object, name_of, node_text, object_properties, parse, string_value

REPO = Path(__file__).resolve().parents[2]
MAIN = REPO / "infra" / "main.bicep"
NO_ZRS = {"australiasoutheast", "northcentralus", "southindia", "ukwest", "westcentralus", "westus",
          "eastus2euap"}


def _declaration(kind: str, name: str):
    tree = parse(MAIN)
    (node,) = [n for n in tree.root_node.children if n.type == kind and name_of(n) == name]
    return node


def _decorator_argument(name: str, decorator: str):
    decorators = _declaration("parameter_declaration", name).prev_sibling
    assert decorators is not None and decorators.type == "decorators"
    for call in (c for d in decorators.children for c in d.children if c.type == "call_expression"):
        if node_text(call.child_by_field_name("function")) == decorator:
            arguments = call.child_by_field_name("arguments")
            return next(c for c in arguments.children if c.type not in ("(", ")"))
    raise AssertionError(f"@{decorator} missing on {name}")


def _allowed(name: str) -> List[str]:
    values = _decorator_argument(name, "allowed").children
    return [string_value(c) or "" for c in values if c.type == "string"]


def _table() -> Dict[str, str]:
    value = _declaration("variable_declaration", "zoneRedundantByRegion").children[-1]
    return {key: node_text(v) for key, v in object_properties(value).items()}


def test_the_table_covers_exactly_the_allowed_regions() -> None:
    allowed = _allowed("location")
    assert len(allowed) == len(set(allowed)) == 32
    assert list(_table()) == allowed  # same regions, same order: one list to read


def test_the_table_matches_microsofts_zrs_list() -> None:
    table = _table()
    assert set(table.values()) == {"true", "false"}
    assert {region for region, zrs in table.items() if zrs == "false"} == NO_ZRS


def test_azd_prompts_with_its_location_picker() -> None:
    metadata = _decorator_argument("location", "metadata")
    azd = object_properties(object_properties(metadata)["azd"])
    assert string_value(azd["type"]) == "location"


def test_redundancy_follows_the_table_by_default() -> None:
    assert "" in _allowed("storageSkuName")
    default = _declaration("parameter_declaration", "storageSkuName").children[-1]
    assert string_value(default) == ""
    sku = node_text(_declaration("variable_declaration", "storageSku").children[-1])
    assert sku == "empty(storageSkuName) ? (zoneRedundant ? 'Standard_ZRS' : 'Standard_LRS') : storageSkuName"
    zone = node_text(_declaration("variable_declaration", "zoneRedundant").children[-1])
    assert zone == "zoneRedundantByRegion[location]"
    tree = parse(MAIN)
    params = {}
    for node in tree.root_node.children:
        if node.type == "module_declaration":
            body = body_object(node)
            assert body is not None
            props = object_properties(body)
            if "params" in props:
                given = object_properties(props["params"])
                params[name_of(node)] = {k: node_text(v) for k, v in given.items()}
    assert params["storage"]["skuName"] == params["artifacts"]["skuName"] == "storageSku"
    assert params["eventHubs"]["zoneRedundant"] == "zoneRedundant"


def test_the_deploy_doc_names_the_regions_without_zones() -> None:
    doc = (REPO / "docs" / "deploy.md").read_text()
    assert "az functionapp list-flexconsumption-locations" in doc
    for region in NO_ZRS:
        assert f"`{region}`" in doc, region
