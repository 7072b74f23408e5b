"""What a link's address names: `$cbs`, `$management`, a hub, a partition, or a consumer group's partition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Address:
    kind: str  # "cbs" | "management" | "hub" | "partition" | "consumer" | "unknown"
    hub: str = ""
    partition: Optional[str] = None
    consumer_group: Optional[str] = None
    raw: str = ""


def parse_address(raw: Optional[str]) -> Address:
    """`amqps://host:port/HUB[/Partitions/N]`, `.../HUB/ConsumerGroups/CG/Partitions/N`, or a bare path."""
    text = raw or ""
    if text in ("$cbs", "$management"):
        return Address(text[1:], raw=text)
    path = text
    if "://" in path:
        rest = path.split("://", 1)[1]
        path = rest.split("/", 1)[1] if "/" in rest else ""
    parts = [p for p in path.strip("/").split("/") if p]
    if len(parts) == 1 and parts[0] == "$management":
        return Address("management", raw=text)
    if len(parts) == 1:
        return Address("hub", hub=parts[0], raw=text)
    if len(parts) == 3 and parts[1].lower() == "partitions":
        return Address("partition", hub=parts[0], partition=parts[2], raw=text)
    if len(parts) == 5 and parts[1].lower() == "consumergroups" and parts[3].lower() == "partitions":
        return Address("consumer", hub=parts[0], consumer_group=parts[2], partition=parts[4], raw=text)
    return Address("unknown", raw=text)
