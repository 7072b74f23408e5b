"""The OData `$filter` subset Table storage answers, for bench.table_memory (the in-memory Tables stand-in).

What the SDK sends after its `@name` substitution (azure.data.tables._serialize): comparisons
`eq ne gt ge lt le` between a property and a literal ('text' with '' escapes, datetime'..', guid'..',
X'..', 12, 12L, 1.5, true/false), joined by `and` / `or` / `not` and parentheses. The service's rules
kept here: a property compares only with a literal of its own type (Int32/Int64/Double compare as
numbers), strings compare ordinally, and a comparison with an absent property is false.
`key_ranges` lets the stand-in read only the RowKey/PartitionKey ranges a filter can match.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

OPS = ("eq", "ne", "gt", "ge", "lt", "le")
_TOKEN = re.compile(
    r"\s*(?:(?P<open>\()|(?P<close>\))"
    r"|(?P<typed>(?:datetime|guid|X|binary)'(?:[^']|'')*')"
    r"|(?P<text>'(?:[^']|'')*')"
    r"|(?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[LlDdMm]?)(?![A-Za-z0-9_])"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*))"
)


class FilterError(ValueError):
    """A filter outside the subset (the stand-in answers 400, as the service does for a bad filter)."""


Typed = Tuple[str, Any]  # (kind, value): kind is one of str, num, bool, datetime, guid, binary


@dataclass(frozen=True)
class Cmp:
    prop: str
    op: str
    literal: Typed


@dataclass(frozen=True)
class Bool:
    op: str  # and | or | not
    args: Tuple[Node, ...]


Node = Union[Cmp, Bool]


def parse_datetime(text: str) -> datetime:
    """An Edm.DateTime as the service writes it (up to 7 fractional digits, 'Z')."""
    text = text.strip().rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6].ljust(6, '0')}"
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def _literal(kind: str, token: str) -> Typed:
    if kind == "text":
        return ("str", token[1:-1].replace("''", "'"))
    if kind == "number":
        body = token.rstrip("LlDdMm")
        return ("num", float(body) if any(c in body for c in ".eE") else int(body))
    prefix, _, rest = token.partition("'")
    value = rest[:-1].replace("''", "'")
    if prefix == "datetime":
        return ("datetime", parse_datetime(value))
    if prefix == "guid":
        return ("guid", value.lower())
    return ("binary", bytes.fromhex(value))


def _tokens(text: str) -> List[Tuple[str, str]]:
    out, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        found = _TOKEN.match(text, at)
        if not found:
            raise FilterError(f"cannot read the filter at {text[at:at + 30]!r}")
        kind = found.lastgroup or ""
        out.append((kind, found.group(kind)))
        at = found.end()
    return out


def parse(text: str) -> Node:
    tokens = _tokens(text)
    node, at = _or(tokens, 0)
    if at != len(tokens):
        raise FilterError(f"unexpected {tokens[at][1]!r} in the filter")
    return node


def _or(tokens: List[Tuple[str, str]], at: int) -> Tuple[Node, int]:
    return _joined(tokens, at, "or", _and)


def _and(tokens: List[Tuple[str, str]], at: int) -> Tuple[Node, int]:
    return _joined(tokens, at, "and", _not)


def _joined(tokens: List[Tuple[str, str]], at: int, word: str,
            inner: Callable[[List[Tuple[str, str]], int], Tuple[Node, int]]) -> Tuple[Node, int]:
    node, at = inner(tokens, at)
    args = [node]
    while at < len(tokens) and tokens[at] == ("word", word):
        node, at = inner(tokens, at + 1)
        args.append(node)
    return (args[0] if len(args) == 1 else Bool(word, tuple(args))), at


def _not(tokens: List[Tuple[str, str]], at: int) -> Tuple[Node, int]:
    if at < len(tokens) and tokens[at] == ("word", "not"):
        node, at = _not(tokens, at + 1)
        return Bool("not", (node,)), at
    if at < len(tokens) and tokens[at][0] == "open":
        node, at = _or(tokens, at + 1)
        if at >= len(tokens) or tokens[at][0] != "close":
            raise FilterError("a parenthesis is not closed")
        return node, at + 1
    if at + 3 > len(tokens):
        raise FilterError("the filter ends inside a comparison")
    (k1, left), (k2, op), (k3, right) = tokens[at:at + 3]
    if k2 != "word" or op not in OPS:
        raise FilterError(f"unknown operator {op!r}")
    if k1 == "word" and left not in ("true", "false") and k3 != "word":
        return Cmp(left, op, _literal(k3, right)), at + 3
    if k3 == "word" and right not in ("true", "false") and k1 != "word":
        flipped = {"gt": "lt", "ge": "le", "lt": "gt", "le": "ge"}.get(op, op)
        return Cmp(right, flipped, _literal(k1, left)), at + 3
    if k1 == "word" and k3 == "word" and right in ("true", "false"):
        return Cmp(left, op, ("bool", right == "true")), at + 3
    raise FilterError(f"unsupported comparison {left} {op} {right}")


def typed_value(entity: Dict[str, Any], name: str) -> Optional[Typed]:
    """A stored property (OData JSON with @odata.type annotations) as a comparable (kind, value)."""
    if name not in entity:
        return None
    value, edm = entity[name], entity.get(f"{name}@odata.type", "")
    if edm == "Edm.DateTime":
        return ("datetime", parse_datetime(value))
    if edm == "Edm.Int64":
        return ("num", int(value))
    if edm == "Edm.Double":
        return ("num", float(value))
    if edm == "Edm.Guid":
        return ("guid", str(value).lower())
    if edm == "Edm.Binary":
        return ("binary", base64.b64decode(value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    return ("str", value)


def _compare(have: Optional[Typed], op: str, want: Typed) -> bool:
    if have is None or have[0] != want[0]:
        return False
    a, b = have[1], want[1]
    return {"eq": a == b, "ne": a != b, "gt": a > b, "ge": a >= b, "lt": a < b, "le": a <= b}[op]


def matches(node: Node, entity: Dict[str, Any]) -> bool:
    if isinstance(node, Cmp):
        return _compare(typed_value(entity, node.prop), node.op, node.literal)
    if node.op == "and":
        return all(matches(a, entity) for a in node.args)
    if node.op == "or":
        return any(matches(a, entity) for a in node.args)
    return not matches(node.args[0], entity)


Range = Tuple[Optional[str], bool, Optional[str], bool]  # (low, low inclusive, high, high inclusive)


def key_ranges(node: Optional[Node], prop: str) -> Optional[List[Range]]:
    """The string ranges of `prop` a row must fall in to match (None: any value). A superset: the
    stand-in still evaluates the whole filter on each row it reads."""
    if node is None:
        return None
    if isinstance(node, Cmp):
        if node.prop != prop or node.literal[0] != "str" or node.op == "ne":
            return None
        v = node.literal[1]
        return [{"eq": (v, True, v, True), "gt": (v, False, None, False), "ge": (v, True, None, False),
                 "lt": (None, False, v, False), "le": (None, False, v, True)}[node.op]]
    if node.op == "not":
        return None
    parts = [key_ranges(a, prop) for a in node.args]
    if node.op == "or":
        if any(p is None for p in parts):
            return None
        return [r for p in parts for r in (p or [])]
    known = [p for p in parts if p is not None]
    if not known:
        return None
    out = known[0]
    for other in known[1:]:
        out = [r for a in out for b in other for r in [_intersect(a, b)] if r is not None]
    return out


def _intersect(a: Range, b: Range) -> Optional[Range]:
    lo, lo_in = a[0], a[1]
    if b[0] is not None and (lo is None or b[0] > lo or (b[0] == lo and not b[1])):
        lo, lo_in = b[0], b[1]
    hi, hi_in = a[2], a[3]
    if b[2] is not None and (hi is None or b[2] < hi or (b[2] == hi and not b[3])):
        hi, hi_in = b[2], b[3]
    if lo is not None and hi is not None and (lo > hi or (lo == hi and not (lo_in and hi_in))):
        return None
    return (lo, lo_in, hi, hi_in)


def compared_props(node: Optional[Node]) -> List[str]:
    """The properties `node` compares for equality with a string (index candidates), in order."""
    if node is None:
        return []
    if isinstance(node, Cmp):
        return [node.prop] if node.op == "eq" and node.literal[0] == "str" else []
    return list(dict.fromkeys(p for a in node.args for p in compared_props(a)))


def equal_values(node: Optional[Node], prop: str) -> Optional[List[str]]:
    """The string values `prop` must equal for a row to match (None: not bounded to a few values)."""
    ranges = key_ranges(node, prop)
    if ranges is None or any(lo is None or lo != hi or not (a and b) for lo, a, hi, b in ranges):
        return None
    return [str(r[0]) for r in ranges]
