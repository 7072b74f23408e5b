"""Resource bodies of infra/ checked against Azure's generated resource types (the bicep-types-az data the
Bicep compiler itself uses), offline: the reference lives outside the repository (../shared/bicep-types,
never copied in), so this runs where that directory is and says so where it is not.

For every `resource` declaration:
- its type@apiVersion is in the reference (a type or version that is not there cannot be checked: fix it
  or add it to the reference);
- a new resource's file scope (targetScope, or an explicit `scope:`) is one the type can be written at;
- every property set is one the type declares (recursively, through discriminated objects such as an
  Event Grid destination's `endpointType`), no read-only property is set, required ones are there, and
  a literal value has the declared kind and, where the type lists values only, one of them.
Expressions (parameters, references, interpolated strings) are not evaluated: only literals are checked.
The same check takes a JSON body (`check_body`), e.g. a PATCH that a script sends.

`python -m tools.bicep_types infra ../shared/bicep-types [MORE...]` prints one finding per line; exit 1 if
any.
MORE: directories of types the shared extract lacks (the policy types: tools/policy_reference.py's cache).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import tree_sitter as ts

from tools.bicep_syntax import (
    Finding,
    body_object,
    line_of,
    name_of,
    node_text,
    object_properties,
    parse,
    string_value,
)

REQUIRED, READ_ONLY = 1, 2
SCOPES = {"tenant": 1, "managementGroup": 2, "subscription": 4, "resourceGroup": 8}
EXTENSION = 16
BICEP_KEYWORDS = {"parent", "scope", "dependsOn"}  # resource body keys Bicep takes, not in ARM's body


class Expr:
    """A value only known at deployment (a parameter, a reference, an interpolated string)."""


EXPR = Expr()


@dataclass(frozen=True)
class Either:
    """The branches of a `cond ? a : b`: each must fit."""
    branches: Tuple[Any, ...]


def literal(node: ts.Node) -> Any:
    """A Bicep expression as Python: dict, list, str, int, bool, None, Either, or EXPR."""
    kind = node.type
    if kind == "object":
        return {k: literal(v) for k, v in object_properties(node).items()}
    if kind == "array":
        return [literal(c) for c in node.children if c.type not in ("[", "]", ",")]
    if kind == "string":
        value = string_value(node)
        return EXPR if value is None else value
    if kind == "number":
        return int(node_text(node))
    if kind == "boolean":
        return node_text(node) == "true"
    if kind == "null":
        return None
    if kind == "ternary_expression":
        parts = [c for c in node.children if c.type not in ("?", ":")]
        return Either(tuple(literal(p) for p in parts[1:]))
    if kind == "parenthesized_expression":
        inner = [c for c in node.children if c.type not in ("(", ")")]
        return literal(inner[0]) if len(inner) == 1 else EXPR
    return EXPR


class Reference:
    """The reference directory: index.json plus the types.json files it points to. More directories of the
    same layout (e.g. a cache of types the shared extract lacks: tools/policy_reference.py) add types."""

    def __init__(self, root: Path, *extra: Path) -> None:
        self.root = root
        self.index: Dict[str, Tuple[Path, str]] = {}
        for directory in (root, *extra):
            index = json.loads((directory / "index.json").read_text())["resources"]
            for key, ref in index.items():
                self.index.setdefault(key.lower(), (directory, ref["$ref"]))
        self._files: Dict[Path, List[Dict[str, Any]]] = {}

    def resource(self, type_version: str) -> Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]]:
        found = self.index.get(type_version.lower())
        if found is None:
            return None
        directory, ref = found
        path, _, position = ref.partition("#/")
        types = self._files.get(directory / path)
        if types is None:
            types = self._files[directory / path] = json.loads((directory / path).read_text())
        return types, types[int(position)]


def _target(types: List[Dict[str, Any]], ref: Dict[str, str]) -> Dict[str, Any]:
    return types[int(ref["$ref"].split("#/")[1])]


def _literal_values(types: List[Dict[str, Any]], node: Dict[str, Any]) -> Optional[List[str]]:
    """The allowed strings of a union of literals; None when any string goes."""
    if node["$type"] == "StringLiteralType":
        return [node["value"]]
    if node["$type"] != "UnionType":
        return None
    values: List[str] = []
    for element in (_target(types, e) for e in node["elements"]):
        if element["$type"] != "StringLiteralType":
            return None
        values.append(element["value"])
    return values


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    return {str: "string", dict: "object", list: "array"}.get(type(value), "null")


def check_value(types: List[Dict[str, Any]], node: Dict[str, Any], value: Any, where: str) -> List[str]:
    """Every way `value` does not fit the type `node`, one message each (empty: it fits)."""
    if value is EXPR or value is None:
        return []
    if isinstance(value, Either):
        return [p for branch in value.branches for p in check_value(types, node, branch, where)]
    kind = node["$type"]
    if kind == "AnyType":
        return []
    if kind in ("StringType", "StringLiteralType", "UnionType"):
        allowed = _literal_values(types, node)
        if kind == "UnionType" and allowed is None:
            # A union with non-literal members (e.g. literals | string): strings pass, others by member.
            members = [_target(types, e) for e in node["elements"]]
            documented = [m["value"] for m in members if m["$type"] == "StringLiteralType"]
            if isinstance(value, str) and any(m["$type"] == "StringType" for m in members):
                # Bicep itself accepts any string here; a value the type does not document is still a typo
                # far more often than a new value, so it is reported (the reference can be updated).
                if documented and value not in documented:
                    listed = ", ".join(map(repr, documented))
                    return [f"{where}: {value!r} is not one of the documented {listed}"]
                return []
            fits = [m for m in members if not check_value(types, m, value, where)]
            return [] if fits else [f"{where}: {_kind(value)} {value!r} fits none of the union's members"]
        if not isinstance(value, str):
            return [f"{where}: expected a string, got {_kind(value)}"]
        if allowed is not None and value not in allowed:
            return [f"{where}: {value!r} is not one of {', '.join(map(repr, allowed))}"]
        return []
    if kind == "IntegerType":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{where}: expected an int, got {_kind(value)}"]
    if kind == "BooleanType":
        return [] if isinstance(value, bool) else [f"{where}: expected a bool, got {_kind(value)}"]
    if kind == "ArrayType":
        if not isinstance(value, list):
            return [f"{where}: expected an array, got {_kind(value)}"]
        item = _target(types, node["itemType"])
        return [p for i, v in enumerate(value) for p in check_value(types, item, v, f"{where}[{i}]")]
    if kind == "ObjectType":
        return _check_object(types, node.get("properties", {}), node.get("additionalProperties"),
                             value, where, node.get("name", "object"))
    if kind == "DiscriminatedObjectType":
        return _check_discriminated(types, node, value, where)
    return []


def _check_object(types: List[Dict[str, Any]], declared: Dict[str, Any], additional: Optional[Dict[str, str]],
                  value: Any, where: str, type_name: str) -> List[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object, got {_kind(value)}"]
    problems = []
    for key, item in value.items():
        prop = declared.get(key)
        if prop is None:
            if additional is None:
                known = ", ".join(sorted(declared)) or "none"
                problems.append(f"{where}.{key}: {type_name} has no property {key!r} (it has: {known})")
            else:
                problems += check_value(types, _target(types, additional), item, f"{where}.{key}")
            continue
        flags = prop.get("flags", 0)
        if flags & READ_ONLY and not flags & REQUIRED:
            problems.append(f"{where}.{key}: read-only in {type_name}")
            continue
        problems += check_value(types, _target(types, prop["type"]), item, f"{where}.{key}")
    for key, prop in declared.items():
        if prop.get("flags", 0) & REQUIRED and key not in value:
            problems.append(f"{where}: {type_name} requires {key!r}")
    return problems


def _check_discriminated(types: List[Dict[str, Any]], node: Dict[str, Any], value: Any,
                         where: str) -> List[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object, got {_kind(value)}"]
    key = node["discriminator"]
    chosen = value.get(key)
    base = node.get("baseProperties", {})
    if chosen is EXPR or isinstance(chosen, Either):
        # Unknown branch: only the base properties can be checked.
        rest = {k: v for k, v in value.items() if k in base}
        return _check_object(types, base, None, rest, where, node["name"])
    elements = node["elements"]
    if chosen not in elements:
        return [f"{where}.{key}: {chosen!r} is not one of {', '.join(map(repr, sorted(elements)))}"]
    element = _target(types, elements[chosen])
    declared = {**base, **element.get("properties", {})}
    return _check_object(types, declared, element.get("additionalProperties"), value, where, element["name"])


def check_body(reference: Reference, type_version: str, body: Dict[str, Any], where: str = "body",
               required: bool = False) -> List[str]:
    """A JSON body (a PUT or PATCH payload) against the resource type's body. PATCH: required=False
    leaves out the required-properties rule (a PATCH names only what changes)."""
    found = reference.resource(type_version)
    if found is None:
        return [f"{type_version} is not in the reference types"]
    types, resource = found
    problems = check_value(types, _target(types, resource["body"]), body, where)
    if not required:
        problems = [p for p in problems if " requires " not in p]
    return problems


def _target_scope(tree: ts.Tree) -> str:
    for node in tree.root_node.children:
        if node.type == "target_scope_assignment" or node_text(node).startswith("targetScope"):
            strings = [string_value(c) for c in node.children if c.type == "string"]
            if strings and strings[0]:
                return strings[0]
    return "resourceGroup"


def _is_existing(node: ts.Node) -> bool:
    return any(node_text(c) == "existing" for c in node.children)


def check_file(path: Path, reference: Reference) -> List[Finding]:
    tree = parse(path)
    scope = _target_scope(tree)
    found: List[Finding] = []
    for node in tree.root_node.children:
        if node.type != "resource_declaration":
            continue
        type_version = next((string_value(c) for c in node.children if c.type == "string"), None) or ""
        symbol, line = name_of(node) or "?", line_of(node)
        resolved = reference.resource(type_version)
        if resolved is None:
            found.append(Finding(str(path), line, f"{symbol}: {type_version} is not in the reference types"))
            continue
        if _is_existing(node):
            continue
        types, resource = resolved
        body = body_object(node)
        value = literal(body) if body is not None else {}
        writable = resource.get("writableScopes", 0)
        own_scope = "scope" in value
        wanted = EXTENSION if own_scope and scope != "subscription" else SCOPES.get(scope, 8)
        if own_scope and not writable & (EXTENSION | SCOPES["resourceGroup"] | SCOPES["subscription"]):
            found.append(Finding(str(path), line, f"{symbol}: {type_version} cannot take a scope"))
        elif not own_scope and not writable & wanted:
            found.append(Finding(str(path), line, f"{symbol}: {type_version} cannot be deployed at {scope} "
                                 "scope (put it in a module scoped to a resource group)"))
        arm_body = {k: v for k, v in value.items() if k not in BICEP_KEYWORDS}
        problems = check_value(types, _target(types, resource["body"]), arm_body, symbol)
        found += [Finding(str(path), line, p) for p in problems]
    return found


def check_tree(root: Path, reference_root: Path, *extra: Path) -> List[Finding]:
    reference = Reference(reference_root, *extra)
    return [f for path in sorted(root.rglob("*.bicep")) for f in check_file(path, reference)]


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m tools.bicep_types INFRA_DIR BICEP_TYPES_DIR [MORE_TYPES_DIR...]",
              file=sys.stderr)
        return 2
    reference, extra = Path(args[1]), [Path(a) for a in args[2:]]
    for directory in (reference, *extra):
        if not (directory / "index.json").is_file():
            print(f"bicep_types: no index.json in {directory} (a bicep-types reference directory)",
                  file=sys.stderr)
            return 3
    findings = check_tree(Path(args[0]), reference, *extra)
    for finding in findings:
        print(finding)
    print(f"{len(findings)} finding(s) against {reference}")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
