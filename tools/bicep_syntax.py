"""The Bicep syntax tree (tree-sitter-bicep) and the small helpers every offline check walks it with:
parse a file, read a node's text, line, name or string value, an object's properties, a resource's
body, and the `Finding` every check reports. tools/bicep_check.py and tools/bicep_rules.py build on it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import tree_sitter as ts
import tree_sitter_bicep as tsb

_PARSER = ts.Parser(ts.Language(tsb.language()))

DECLARATIONS = {
    "parameter_declaration", "variable_declaration", "resource_declaration", "module_declaration",
    "output_declaration", "type_declaration", "user_defined_function",
}
# In a .bicepparam, `param name = value` has the grammar of `var name = value`; tree-sitter-bicep 1.1
# knows only the template form (`param name type`), so the keyword is swapped, byte for byte.
_BICEPPARAM_PARAM = re.compile(rb"^(\s*)param(\s)", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def parse(path: Path) -> ts.Tree:
    source = path.read_bytes()
    if path.suffix == ".bicepparam":
        source = _BICEPPARAM_PARAM.sub(lambda m: m.group(1) + b"var  " + m.group(2), source)
    return _PARSER.parse(source)


def node_text(node: ts.Node) -> str:
    return node.text.decode("utf-8") if node.text is not None else ""


def line_of(node: ts.Node) -> int:
    return node.start_point[0] + 1


def walk(node: ts.Node) -> Iterator[ts.Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


def syntax_errors(path: Path, tree: Optional[ts.Tree] = None) -> List[Finding]:
    tree = tree or parse(path)
    found = []
    for node in walk(tree.root_node):
        if node.type == "ERROR" or node.is_missing:
            near = node_text(node)[:40]
            what = f"missing {node.type}" if node.is_missing else f"syntax error near {near!r}"
            found.append(Finding(str(path), line_of(node), what))
    return found


def name_of(declaration: ts.Node) -> Optional[str]:
    named = declaration.child_by_field_name("name")
    if named is not None:
        return node_text(named)
    for child in declaration.children:
        if child.type == "identifier":
            return node_text(child)
    return None


def string_value(node: ts.Node) -> Optional[str]:
    """The content of a plain string literal (None when it interpolates)."""
    if node.type != "string":
        return None
    if any(c.type == "interpolation" for c in node.children):
        return None
    return "".join(node_text(c) for c in node.children if c.type in ("string_content", "escape_sequence"))


def _property_key(prop: ts.Node) -> Optional[str]:
    key = prop.children[0] if prop.children else None
    if key is None:
        return None
    if key.type in ("identifier", "compatible_identifier"):
        return node_text(key)
    return string_value(key)


def object_properties(obj: ts.Node) -> Dict[str, ts.Node]:
    """key -> value node of an object literal's properties (nested resources left out)."""
    props: Dict[str, ts.Node] = {}
    for prop in obj.children:
        if prop.type != "object_property" or len(prop.children) < 3:
            continue
        key = _property_key(prop)
        if key is not None:
            props[key] = prop.children[-1]
    return props


def body_object(declaration: ts.Node) -> Optional[ts.Node]:
    """The object body of a resource/module, through `if (...)` and `[for ...: ...]`."""
    for child in declaration.children:
        node = child
        while node is not None and node.type in ("if_statement", "for_statement"):
            node = node.child_by_field_name("body") or next(
                (c for c in reversed(node.children) if c.type in ("object", "if_statement")), None)
        if node is not None and node.type == "object":
            return node
    return None


def is_declaration_name(node: ts.Node) -> bool:
    parent = node.parent
    if parent is None:
        return False
    if parent.type in DECLARATIONS or parent.type in ("parameter", "import_functionality"):
        return next((c for c in parent.children if c.type == "identifier"), None) == node
    if parent.type == "object_property":
        return parent.children[0] == node
    if parent.type == "for_statement":
        return node.prev_sibling is not None and node.prev_sibling.type == "for"
    if parent.type == "lambda_expression":
        return parent.children[0] == node
    return False
