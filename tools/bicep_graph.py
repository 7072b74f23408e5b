"""Two offline checks on a composition of modules (infra/main.bicep) that ARM would only show by failing:

- ordering: which module deploys after which (dependsOn, or reading another module's outputs), and the
  rule that no module is handed an identity (its resource id or client id) before every module that
  grants that identity a role (is handed its principal id) has finished;
- name lengths: the longest value a name expression can take, from @maxLength/@allowed of the
  parameters it reads, take(), uniqueString() (13 characters), guid() (36) and literal text.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import tree_sitter as ts

from tools.bicep_check import body_object, name_of, node_text, object_properties, string_value, walk
from tools.bicep_rules import references

IDENTITY_SUFFIXES = ("PrincipalId", "ClientId", "Id")


def _modules(tree: ts.Tree) -> Dict[str, ts.Node]:
    return {name_of(n) or "": n for n in tree.root_node.children if n.type == "module_declaration"}


def module_graph(tree: ts.Tree) -> Dict[str, Set[str]]:
    """module -> the modules it waits for: its dependsOn entries and every module whose outputs it reads."""
    modules = _modules(tree)
    return {name: references(node) & (set(modules) - {name}) for name, node in modules.items()}


def depends_on(graph: Dict[str, Set[str]], later: str, earlier: str) -> bool:
    seen: Set[str] = set()
    stack = list(graph.get(later, ()))
    while stack:
        current = stack.pop()
        if current == earlier:
            return True
        if current not in seen:
            seen.add(current)
            stack.extend(graph.get(current, ()))
    return False


def _output_reads(node: ts.Node) -> Set[Tuple[str, str]]:
    """(module, output) pairs an expression reads as `module.outputs.output`."""
    pairs = set()
    for n in walk(node):
        if n.type == "member_expression" and n.children and n.children[0].type == "member_expression":
            inner = n.children[0]
            if (inner.children and inner.children[0].type == "identifier"
                    and node_text(inner.children[-1]) == "outputs"):
                pairs.add((node_text(inner.children[0]), node_text(n.children[-1])))
    return pairs


def _split_identity(output: str) -> Optional[Tuple[str, str]]:
    for suffix in IDENTITY_SUFFIXES:
        if output.endswith(suffix) and len(output) > len(suffix):
            return output[: -len(suffix)], suffix
    return None


def identity_order_findings(tree: ts.Tree) -> List[str]:
    """A module handed an identity's id/client id must wait for every module handed its principal id."""
    users: Dict[Tuple[str, str], Set[str]] = {}
    granters: Dict[Tuple[str, str], Set[str]] = {}
    for name, node in _modules(tree).items():
        body = body_object(node)
        params = object_properties(body).get("params") if body is not None else None
        for source, output in _output_reads(params) if params is not None else ():
            split = _split_identity(output)
            if split is None:
                continue
            key = (source, split[0])
            (granters if split[1] == "PrincipalId" else users).setdefault(key, set()).add(name)
    graph = module_graph(tree)
    problems = []
    for key, granting in sorted(granters.items()):
        for user in sorted(users.get(key, set()) - granting):
            for granter in sorted(granting):
                if not depends_on(graph, user, granter):
                    problems.append(f"module {user} uses {key[0]}'s {key[1]} but does not wait for module "
                                    f"{granter}, which assigns that identity's roles")
    return problems


# ---- name lengths ----

UNIQUE_STRING_LENGTH = 13
GUID_LENGTH = 36


def _param_bound(declaration: ts.Node) -> Optional[int]:
    previous = declaration.prev_sibling
    if previous is None or previous.type != "decorators":
        return None
    for call in (c for d in previous.children for c in d.children if c.type == "call_expression"):
        function = node_text(call.child_by_field_name("function") or call)
        arguments = [c for c in (call.child_by_field_name("arguments") or call).children
                     if c.type not in ("(", ")", ",")]
        if function == "maxLength" and arguments and arguments[0].type == "number":
            return int(node_text(arguments[0]))
        if function == "allowed" and arguments and arguments[0].type == "array":
            values = [string_value(v) for v in arguments[0].children if v.type == "string"]
            if values and all(v is not None for v in values):
                return max(len(v or "") for v in values)
    return None


class NameBounds:
    """Upper bounds of string expressions in one file; None = no bound can be shown."""

    def __init__(self, tree: ts.Tree) -> None:
        top = tree.root_node.children
        self.params = {name_of(n) or "": n for n in top if n.type == "parameter_declaration"}
        self.vars = {name_of(n) or "": n for n in top if n.type == "variable_declaration"}

    def of(self, node: ts.Node) -> Optional[int]:
        kind = node.type
        if kind == "string":
            total = 0
            for child in node.children:
                if child.type == "string_content":
                    total += len(node_text(child))
                elif child.type == "escape_sequence":
                    total += 1
                elif child.type == "interpolation":
                    inner = [c for c in child.children if c.type not in ("${", "}")]
                    part = self.of(inner[0]) if inner else None
                    if part is None:
                        return None
                    total += part
            return total
        if kind == "identifier":
            name = node_text(node)
            if name in self.params:
                return _param_bound(self.params[name])
            if name in self.vars:
                return self.of(self.vars[name].children[-1])
            return None
        if kind == "parenthesized_expression":
            inner = [c for c in node.children if c.type not in ("(", ")")]
            return self.of(inner[0]) if inner else None
        if kind == "ternary_expression":
            branches = [c for c in node.children if c.type not in ("?", ":")][1:]
            bounds = [self.of(b) for b in branches]
            known = [b for b in bounds if b is not None]
            return max(known) if known and len(known) == len(bounds) else None
        if kind == "call_expression":
            return self._call(node)
        return None

    def _call(self, node: ts.Node) -> Optional[int]:
        function = node_text(node.child_by_field_name("function") or node)
        arguments = [c for c in (node.child_by_field_name("arguments") or node).children
                     if c.type not in ("(", ")", ",")]
        if function == "uniqueString":
            return UNIQUE_STRING_LENGTH
        if function == "guid":
            return GUID_LENGTH
        if function in ("toLower", "toUpper", "trim") and arguments:
            return self.of(arguments[0])
        if function == "take" and len(arguments) == 2 and arguments[1].type == "number":
            limit = int(node_text(arguments[1]))
            inner = self.of(arguments[0])
            return limit if inner is None else min(limit, inner)
        return None
