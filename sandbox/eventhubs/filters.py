"""The `apache.org:selector-filter:string` starting-position filter the SDK puts on receiver links."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .store import Partition

SELECTOR_FILTER = b"apache.org:selector-filter:string"
_EXPR = re.compile(
    r"^\s*amqp\.annotation\.x-opt-(offset|sequence-number|enqueued-time)\s*(>=|>|=)\s*'?([^']*)'?\s*$")


class FilterError(ValueError):
    """The selector is not one the server understands (sent back as amqp:invalid-field)."""


@dataclass(frozen=True)
class StartPosition:
    kind: str  # "offset" | "sequence-number" | "enqueued-time"
    op: str  # ">", ">=" or "="
    value: str

    def first_sequence(self, partition: Partition) -> int:
        """The sequence number of the first event this position delivers (may be in the future)."""
        inclusive = self.op in (">=", "=")
        if self.kind == "offset":
            if self.value == "-1":
                return partition.begin_sequence
            if self.value == "@latest":
                return partition.next_sequence
            base = _integer(self.value)
        elif self.kind == "sequence-number":
            base = _integer(self.value)
        else:
            return partition.first_after_time(_integer(self.value), inclusive)
        return max(base if inclusive else base + 1, partition.begin_sequence)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise FilterError(f"not an integer in the selector filter: {text!r}") from None


def parse_filters(filters: Optional[Dict[Any, Any]]) -> StartPosition:
    """No filter means 'from the beginning' (what Event Hubs does)."""
    if not filters:
        return StartPosition("offset", ">", "-1")
    expr = filters.get(SELECTOR_FILTER)
    if expr is None:
        return StartPosition("offset", ">", "-1")
    if isinstance(expr, (bytes, bytearray, memoryview)):
        expr = bytes(expr).decode("utf-8")
    match = _EXPR.match(str(expr))
    if not match:
        raise FilterError(f"unsupported selector filter {expr!r}: expected "
                          "amqp.annotation.x-opt-offset|sequence-number|enqueued-time (>|>=|=) 'value'")
    return StartPosition(match.group(1), match.group(2), match.group(3))
