"""Test helper: evaluates the parts of Azure Policy's rule language and of ARM template expressions that
infra/coverage/definitions/*.json use, so tests can ask what a rule does to a resource. It is a reading of
the documented language (conditions allOf/anyOf/not, equals/notEquals/in/notIn/exists/like; functions
parameters, field, concat, toLower, if, equals, ...), not Azure's engine: an expression it does not know
raises, so a rule using more than this reads as a test failure, never as a silent pass."""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Callable, Dict, List, Mapping, Optional

TOKEN = re.compile(r"\s*(?:('(?:[^']|'')*')|(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(.))")


class Unknown(Exception):
    """An expression or condition this reading does not cover."""


def _tokens(text: str) -> List[Any]:
    out: List[Any] = []
    for match in TOKEN.finditer(text):
        string, number, name, other = match.groups()
        if string is not None:
            out.append(("s", string[1:-1].replace("''", "'")))
        elif number is not None:
            out.append(("s", int(number)))
        elif name is not None:
            out.append(("n", name))
        elif other and other.strip():
            out.append(("p", other))
    return out


class Expressions:
    """`[...]` strings, with the functions given (name -> callable on evaluated arguments)."""

    def __init__(self, functions: Mapping[str, Callable[..., Any]]) -> None:
        base: Dict[str, Callable[..., Any]] = {
            "concat": lambda *a: "".join(map(str, a)),
            "toLower": lambda s: s.lower(),
            "if": lambda c, a, b: a if c else b,
            "equals": lambda a, b: a == b,
            "not": lambda a: not a,
            "true": lambda: True,
            "false": lambda: False,
            "createArray": lambda *a: list(a),
            "createObject": lambda *a: dict(zip(a[0::2], a[1::2])),
            "string": lambda a: a if isinstance(a, str) else __import__("json").dumps(a),
            "base64": lambda s: __import__("base64").b64encode(s.encode()).decode(),
            "split": lambda s, sep: s.split(sep),
            "last": lambda a: a[-1],
        }
        self.functions = {**base, **functions}

    def value(self, text: Any) -> Any:
        if not isinstance(text, str) or not text.startswith("[") or text.startswith("[["):
            return text
        tokens = _tokens(text[1:-1])
        result, rest = self._expr(tokens)
        if rest:
            raise Unknown(f"trailing tokens in {text}")
        return result

    def _expr(self, tokens: List[Any]) -> Any:
        kind, item = tokens[0]
        if kind == "s":
            result, rest = item, tokens[1:]
        elif kind == "n":
            if item not in self.functions:
                raise Unknown(f"function {item}()")
            args, rest = [], tokens[2:]
            while rest[0] != ("p", ")"):
                arg, rest = self._expr(rest)
                args.append(arg)
                if rest[0] == ("p", ","):
                    rest = rest[1:]
            result, rest = self.functions[item](*args), rest[1:]
        else:
            raise Unknown(f"token {item}")
        while rest and rest[0] in (("p", "["), ("p", ".")):
            if rest[0] == ("p", "["):
                index, rest = self._expr(rest[1:])
                result, rest = result[index], rest[1:]
            else:
                result, rest = result[rest[1][1]], rest[2:]
        return result, rest


def field_value(resource: Mapping[str, Any], field: str, aliases: Mapping[str, str]) -> Any:
    """A field of a resource: top-level fields, tags[name], or an alias (through its default path)."""
    if field in ("type", "name", "location", "id", "kind"):
        return resource.get(field)
    match = re.fullmatch(r"tags\[(.+)\]", field)
    if match:
        return (resource.get("tags") or {}).get(match.group(1).strip("'"))
    path = aliases.get(field.lower())
    if path is None:
        raise Unknown(f"field {field!r} is not an alias of the reference")
    value: Any = resource
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return a == b or (isinstance(b, str) and str(a).lower() == b.lower())


def matches(condition: Mapping[str, Any], resource: Mapping[str, Any], expr: Expressions,
            aliases: Mapping[str, str]) -> bool:
    if "allOf" in condition:
        return all(matches(c, resource, expr, aliases) for c in condition["allOf"])
    if "anyOf" in condition:
        return any(matches(c, resource, expr, aliases) for c in condition["anyOf"])
    if "not" in condition:
        return not matches(condition["not"], resource, expr, aliases)
    value = field_value(resource, expr.value(condition["field"]), aliases)
    (operator, operand), = [(k, v) for k, v in condition.items() if k != "field"]
    operand = expr.value(operand)
    if isinstance(operand, list):
        operand = [expr.value(o) for o in operand]
    if operator == "equals":
        return value is not None and _same(value, operand)
    if operator == "notEquals":
        return value is None or not _same(value, operand)
    if operator == "in":
        return value is not None and any(_same(value, o) for o in operand)
    if operator == "notIn":
        return value is None or not any(_same(value, o) for o in operand)
    if operator == "exists":
        return (value is not None) == (str(operand).lower() == "true")
    if operator == "like":
        return value is not None and fnmatch.fnmatchcase(str(value).lower(), str(operand).lower())
    raise Unknown(f"operator {operator}")


def policy_expressions(parameters: Mapping[str, Any], resource: Optional[Mapping[str, Any]] = None,
                       aliases: Optional[Mapping[str, str]] = None) -> Expressions:
    functions: Dict[str, Callable[..., Any]] = {"parameters": lambda n: parameters[n]}
    if resource is not None:
        functions["field"] = lambda f: field_value(resource, f, aliases or {})
    return Expressions(functions)


def applies(definition: Mapping[str, Any], values: Mapping[str, Any], resource: Mapping[str, Any],
            aliases: Mapping[str, str]) -> bool:
    """The definition's `if` holds for the resource, with the parameter values (defaults filled in)."""
    params = {k: v.get("defaultValue") for k, v in definition["parameters"].items()}
    params.update(values)
    expr = policy_expressions(params, resource, aliases)
    return matches(definition["policyRule"]["if"], resource, expr, aliases)


def walk_fields(node: Any) -> List[str]:
    """Every `field` named in a rule (conditions and Modify operations), as written."""
    found: List[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("field"), str):
            found.append(node["field"])
        for key, value in node.items():
            if key != "deployment":
                found += walk_fields(value)
    elif isinstance(node, list):
        for item in node:
            found += walk_fields(item)
    return found
