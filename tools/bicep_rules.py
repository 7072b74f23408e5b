"""Warnings the Bicep compiler and its default linter would print, checked offline (no compiler here):

- no-unused-params / no-unused-vars / no-unused-existing-resources: a declaration nothing reads;
- outputs-should-not-contain-secrets: an output that reads a @secure() parameter (directly or through
  variables);
- no-unnecessary-dependson: a dependsOn entry the body already references (ARM orders it anyway);
- preview API versions: every resource uses a stable (GA) version; a preview one fails the check
  (all of infra/'s types have GA versions: tests/infra/test_bicep_rules.py says where that was checked).

tools/bicep_check.py runs these on every .bicep file, so `python -m tools.bicep_check infra` and
make test fail on any of them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Set

import tree_sitter as ts

from tools.bicep_syntax import (
    Finding,
    body_object,
    is_declaration_name,
    line_of,
    name_of,
    node_text,
    object_properties,
    string_value,
    walk,
)

_PREVIEW = re.compile(r"@\d{4}-\d{2}-\d{2}-(preview|alpha|beta|privatepreview)$", re.IGNORECASE)


def decorator_names(declaration: ts.Node) -> Set[str]:
    """Names of the decorators on a declaration (`@secure()` -> 'secure')."""
    previous = declaration.prev_sibling
    if previous is None or previous.type != "decorators":
        return set()
    names = set()
    for decorator in previous.children:
        for call in decorator.children:
            function = call.child_by_field_name("function") if call.type == "call_expression" else None
            if function is not None:
                names.add(node_text(function))
    return names


def references(node: ts.Node) -> Set[str]:
    """Every symbol an expression reads (identifiers that are not declaration names or keys)."""
    return {node_text(n) for n in walk(node) if n.type == "identifier" and not is_declaration_name(n)}


def _declarations(tree: ts.Tree, kind: str) -> Dict[str, ts.Node]:
    return {name_of(n) or "": n for n in tree.root_node.children if n.type == kind}


def _is_existing(resource: ts.Node) -> bool:
    return any(c.type == "existing" or node_text(c) == "existing" for c in resource.children)


def unused(path: Path, tree: ts.Tree) -> List[Finding]:
    read: Dict[str, int] = {}
    for node in walk(tree.root_node):
        if node.type == "identifier" and not is_declaration_name(node):
            read[node_text(node)] = read.get(node_text(node), 0) + 1
    found = []
    for kind, rule in (("parameter_declaration", "param"), ("variable_declaration", "var")):
        for name, node in _declarations(tree, kind).items():
            if name and name not in read:
                found.append(Finding(str(path), line_of(node), f"{rule} {name!r} is declared but never used"))
    for name, node in _declarations(tree, "resource_declaration").items():
        if name and _is_existing(node) and name not in read:
            found.append(Finding(str(path), line_of(node),
                                 f"existing resource {name!r} is declared but never used"))
    return found


def secret_outputs(path: Path, tree: ts.Tree) -> List[Finding]:
    secure = {name for name, node in _declarations(tree, "parameter_declaration").items()
              if "secure" in decorator_names(node)}
    variables = _declarations(tree, "variable_declaration")
    tainted = set(secure)
    changed = True
    while changed:  # a variable that reads a secure value is secret too
        changed = False
        for name, node in variables.items():
            if name not in tainted and references(node) & tainted:
                tainted.add(name)
                changed = True
    found = []
    for name, node in _declarations(tree, "output_declaration").items():
        leaked = sorted(references(node) & tainted)
        if leaked:
            found.append(Finding(str(path), line_of(node),
                                 f"output {name!r} reads a secure value ({', '.join(leaked)})"))
    return found


def unnecessary_depends_on(path: Path, tree: ts.Tree) -> List[Finding]:
    found = []
    for node in tree.root_node.children:
        if node.type not in ("resource_declaration", "module_declaration"):
            continue
        body = body_object(node)
        props = object_properties(body) if body is not None else {}
        depends = props.get("dependsOn")
        if depends is None:
            continue
        elsewhere: Set[str] = set()
        for key, value in props.items():
            if key != "dependsOn":
                elsewhere |= references(value)
        for item in depends.children:
            if item.type == "identifier" and node_text(item) in elsewhere:
                found.append(Finding(str(path), line_of(item), f"{name_of(node)}: dependsOn "
                                     f"{node_text(item)!r} is unnecessary (the body already references it)"))
    return found


def preview_api_versions(path: Path, tree: ts.Tree) -> List[Finding]:
    found = []
    for node in tree.root_node.children:
        if node.type != "resource_declaration":
            continue
        strings = (string_value(c) for c in node.children if c.type == "string")
        type_string: Optional[str] = next(strings, None)
        if type_string and _PREVIEW.search(type_string):
            found.append(Finding(str(path), line_of(node),
                                 f"{name_of(node)}: preview API version {type_string}; use a GA version"))
    return found


def warnings(path: Path, tree: ts.Tree) -> List[Finding]:
    """Every rule above on one parsed .bicep file."""
    return (unused(path, tree) + secret_outputs(path, tree) + unnecessary_depends_on(path, tree)
            + preview_api_versions(path, tree))
