"""Session and link state: what the connection keeps per channel and per handle."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional

from .addresses import Address
from .store import Hub, Partition

RECEIVE_CREDIT = 1000  # credit we grant a producer; topped up when half is used
SESSION_WINDOW = 1 << 20


@dataclass
class Link:
    name: str
    handle: int
    client_sends: bool  # the client's role is sender: we receive on this link
    address: Address
    hub: Optional[Hub] = None
    partition: Optional[Partition] = None
    credit: int = 0  # for links we receive on: credit left; for links we send on: the client's credit
    delivery_count: int = 0
    # A delivery arriving in several transfer frames.
    partial: bytearray = field(default_factory=bytearray)
    partial_first: Optional[List[Any]] = None
    oversize: bool = False  # the delivery being read exceeds the maximum message size
    # Links we send on.
    next_sequence: int = 0
    drain: bool = False  # the client asked to drain: use up the credit when nothing is left to send
    outbox: Deque[bytes] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: Optional[asyncio.Task] = None
    detached: bool = False


@dataclass
class Session:
    channel: int
    next_incoming_id: int = 0
    next_outgoing_id: int = 0
    links: Dict[int, Link] = field(default_factory=dict)

    def reply_link(self, node: str) -> Optional[Link]:
        """The link a request/response node answers on: the client's receiver on the same node."""
        for link in self.links.values():
            if not link.client_sends and link.address.kind == node and not link.detached:
                return link
        return None
