"""The Function app's settings agree across three places: the Bicep (infra/app/function.bicep),
central/app_settings.json and function_app.py's bindings (tests/infra/test_app_settings.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set

from tools.bicep_check import name_of, node_text, object_properties, parse, string_value, walk


def object_var_keys(path: Path, var_name: str) -> Set[str]:
    """The keys of `var <var_name> = { ... }` in a Bicep file."""
    tree = parse(path)
    for node in tree.root_node.children:
        if node.type == "variable_declaration" and name_of(node) == var_name:
            value = node.children[-1]
            if value.type != "object":
                raise ValueError(f"{path}: var {var_name} is not an object literal")
            return set(object_properties(value))
    raise ValueError(f"{path}: no var {var_name}")


def load_json_targets(path: Path) -> List[Path]:
    """Files a Bicep file reads with loadJsonContent('...'), resolved."""
    tree = parse(path)
    targets = []
    for node in walk(tree.root_node):
        if node.type == "call_expression":
            function = node.child_by_field_name("function")
            if function is not None and node_text(function) == "loadJsonContent":
                arguments = node.child_by_field_name("arguments")
                strings = [c for c in arguments.children if c.type == "string"] if arguments else []
                first = strings[0] if strings else None
                if first is not None and string_value(first):
                    targets.append((path.parent / (string_value(first) or "")).resolve())
    return targets


def binding_setting_refs(bindings: List[Dict[str, object]]) -> Dict[str, Set[str]]:
    """App setting names binding metadata reads: `%NAME%` values and `connection` prefixes."""
    names: Set[str] = set()
    prefixes: Set[str] = set()
    for binding in bindings:
        for key, value in binding.items():
            if not isinstance(value, str):
                continue
            names.update(re.findall(r"%([^%]+)%", value))
            if key == "connection" and value:
                prefixes.add(value)
    return {"names": names, "connection_prefixes": prefixes}


def app_settings_findings(bicep_names: Set[str], listed: Set[str], refs: Dict[str, Set[str]]) -> List[str]:
    """Every way the three can disagree, one message each (empty: they agree)."""
    problems = [f"central/app_settings.json lists {n!r} but the Bicep sets no value for it"
                for n in sorted(listed - bicep_names)]
    problems += [f"the Bicep sets {n!r}, which central/app_settings.json does not list"
                 for n in sorted(bicep_names - listed)]
    problems += [f"a binding reads %{n}% but central/app_settings.json does not list it"
                 for n in sorted(refs.get("names", set()) - listed)]
    for prefix in sorted(refs.get("connection_prefixes", set())):
        if prefix not in listed and not any(n.startswith(prefix + "__") for n in listed):
            problems.append(f"a binding uses connection {prefix!r} but no {prefix} or {prefix}__* "
                            "setting is listed")
    return problems
