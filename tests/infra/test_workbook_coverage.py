"""The workbook's coverage tile (infra/app/workbook.json, "coverage") reads Resource Graph with the very
query `se-fleet coverage` sends (central/cli/coverage.py), so both count the same VMs; the tile's extra
columns read only what that query's tables hold."""

from __future__ import annotations

import json
from pathlib import Path

from central.cli import coverage

REPO = Path(__file__).resolve().parents[2]
ITEMS = {i.get("name"): i for i in json.loads((REPO / "infra/app/workbook.json").read_text())["items"]}


def test_the_tile_runs_se_fleet_coverage_s_query_on_resource_graph() -> None:
    tile = ITEMS["coverage"]["content"]
    assert tile["queryType"] == 1 and tile["resourceType"] == "microsoft.resourcegraph/resources"
    assert tile["query"].startswith(coverage.inventory_query() + "\n")
    summary = tile["query"].split("| summarize", 1)[1]
    for column in ("vms", "forwarderInstalled", "platformFeed", "excluded", "neither"):
        assert f"{column} = count" in summary
    assert "by subscriptionId, resourceGroup" in summary


def test_the_tile_names_the_extension_and_tag_the_verdicts_use() -> None:
    query = ITEMS["coverage"]["content"]["query"]
    assert query.count(f'"{coverage.EXTENSION_PREFIX}"') >= 2
    assert 'ownerTags["se-forwarder"], tags["se-forwarder"])) =~ "off"' in query  # where the policies read it
    assert coverage.FEED.split(".", 1)[1] in query
