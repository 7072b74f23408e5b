"""Offline checks of infra/ that a Bicep compiler would make, on tree-sitter-bicep syntax trees.

No Bicep compiler runs here, so this checks what matters most when it cannot:
- syntax: every .bicep and .bicepparam parses with no ERROR or MISSING node;
- modules: every module path exists; the params passed match the module's declared params
  (every required one present, none unknown);
- symbols: every identifier used is declared (params, vars, resources, modules, outputs, types,
  functions, loop and lambda variables) or is a Bicep standard-library function or decorator;
- .bicepparam: the `using` target exists and every param it sets is declared there;
- the compiler's and default linter's warnings that can be checked offline (tools/bicep_rules.py).

`python -m tools.bicep_check infra` prints one finding per line and exits 1 if there is any.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set

import tree_sitter as ts

from tools.bicep_rules import warnings
from tools.bicep_syntax import (
    DECLARATIONS,
    Finding,
    body_object,
    is_declaration_name,
    line_of,
    name_of,
    node_text,
    object_properties,
    parse,
    string_value,
    syntax_errors,
    walk,
)

# Bicep's standard library (sys namespace) and the Azure namespace (az), plus .bicepparam functions.
STDLIB_FUNCTIONS = frozenset("""
any array concat contains empty first flatten indexOf intersection items join last lastIndexOf length
max min range skip take union filter map reduce sort toObject mapValues groupBy objectKeys shallowMerge
tryGet coalesce bool int json string float base64 base64ToJson base64ToString dataUri dataUriToString
endsWith format guid newGuid padLeft replace split startsWith substring toLower toUpper trim uniqueString
uri uriComponent uriComponentToString buildUri parseUri dateTimeAdd dateTimeFromEpoch dateTimeToEpoch
utcNow deployment environment loadFileAsBase64 loadJsonContent loadYamlContent loadTextContent
loadDirectoryFileInfo extensionResourceId getSecret list listKeys listAccountSas listServiceSas
managementGroupResourceId pickZones providers reference resourceId subscriptionResourceId
tenantResourceId managementGroup resourceGroup subscription tenant parseCidr cidrSubnet cidrHost
readEnvironmentVariable externalInput not fail
""".split())

DECORATORS = frozenset("""
description minValue maxValue minLength maxLength allowed secure metadata batchSize sealed discriminator
export onlyIfNotExists
""".split())

NAMESPACES = frozenset({"sys", "az"})




@dataclass
class Param:
    name: str
    required: bool


@dataclass
class ModuleRef:
    symbol: str
    target: str
    line: int
    params: Dict[str, int]       # name -> line
    params_given: bool           # False when passed as something other than an object literal


def declared_params(tree: ts.Tree) -> Dict[str, Param]:
    params: Dict[str, Param] = {}
    for node in tree.root_node.children:
        if node.type != "parameter_declaration":
            continue
        name = name_of(node)
        if name is None:
            continue
        has_default = any(c.type == "=" for c in node.children)
        nullable = any(c.type == "type" and node_text(c).rstrip().endswith("?") for c in node.children)
        params[name] = Param(name, required=not (has_default or nullable))
    return params


def module_refs(tree: ts.Tree) -> List[ModuleRef]:
    refs = []
    for node in walk(tree.root_node):
        if node.type != "module_declaration":
            continue
        target = next((string_value(c) for c in node.children if c.type == "string"), None)
        body = body_object(node)
        params: Dict[str, int] = {}
        given = True
        if body is not None and "params" in object_properties(body):
            value = object_properties(body)["params"]
            if value.type == "object":
                params = {k: line_of(v) for k, v in object_properties(value).items()}
            else:
                given = False
        refs.append(ModuleRef(name_of(node) or "?", target or "", line_of(node), params, given))
    return refs


def _top_level_symbols(tree: ts.Tree) -> Set[str]:
    names: Set[str] = set()
    for node in walk(tree.root_node):
        if node.type in DECLARATIONS:
            name = name_of(node)
            if name:
                names.add(name)
        elif node.type == "import_functionality":
            names.update(node_text(c) for c in node.children if c.type == "identifier")
    return names


def _bound_by(node: ts.Node) -> Set[str]:
    """Names a for loop or lambda binds for its subtree."""
    names: Set[str] = set()
    if node.type == "for_statement":
        for child in node.children:
            previous = child.prev_sibling
            if child.type == "identifier" and previous is not None and previous.type == "for":
                names.add(node_text(child))
            if child.type == "for_loop_parameters":
                names.update(node_text(c) for c in child.children
                             if c.type in ("loop_variable", "loop_enumerator"))
    elif node.type == "lambda_expression":
        first = node.children[0] if node.children else None
        if first is not None and first.type == "identifier":
            names.add(node_text(first))
        elif first is not None:
            names.update(node_text(c) for c in walk(first) if c.type == "identifier")
    elif node.type == "user_defined_function":
        for params in node.children:
            if params.type == "parameters":
                for param in params.children:
                    if param.type == "parameter":
                        names.update(node_text(c) for c in param.children[:1] if c.type == "identifier")
    return names


def undeclared(path: Path, tree: Optional[ts.Tree] = None) -> List[Finding]:
    tree = tree or parse(path)
    declared = _top_level_symbols(tree)
    found: List[Finding] = []

    def visit(node: ts.Node, scope: Set[str]) -> None:
        local = scope | _bound_by(node) if node.type in (
            "for_statement", "lambda_expression", "user_defined_function") else scope
        if node.type == "call_expression":
            function = node.child_by_field_name("function")
            if function is not None and function.type == "identifier":
                name = node_text(function)
                in_decorator = node.parent is not None and node.parent.type == "decorator"
                known = DECORATORS if in_decorator else STDLIB_FUNCTIONS
                if name not in known and name not in declared:
                    kind = "decorator" if in_decorator else "function"
                    found.append(Finding(str(path), line_of(function), f"unknown {kind} {name!r}"))
                for child in node.children:
                    if child != function:
                        visit(child, local)
                return
        if node.type == "type" or node.type == "primitive_type":
            return  # type expressions name types, not values
        if node.type == "identifier" and not is_declaration_name(node):
            name = node_text(node)
            following = node.next_sibling
            adjacent = following is not None and following.start_byte == node.end_byte
            if adjacent and following is not None and node_text(following)[:1] == "(":
                # Inside a multi-line array the grammar splits `f().x` into `f` and `().x`: a call.
                if name not in STDLIB_FUNCTIONS and name not in declared:
                    found.append(Finding(str(path), line_of(node), f"unknown function {name!r}"))
                return
            if name not in declared and name not in local and name not in NAMESPACES:
                found.append(Finding(str(path), line_of(node), f"undeclared identifier {name!r}"))
        for child in node.children:
            visit(child, local)

    visit(tree.root_node, set())
    return found


def check_module_refs(path: Path, tree: ts.Tree) -> List[Finding]:
    found = []
    for ref in module_refs(tree):
        if not ref.target or ref.target.startswith(("br:", "br/", "ts:", "ts/")):
            found.append(Finding(str(path), ref.line, f"module {ref.symbol}: only local module files are "
                                 f"allowed (registry modules cannot be checked offline): {ref.target!r}"))
            continue
        target = (path.parent / ref.target).resolve()
        if not target.is_file():
            found.append(Finding(str(path), ref.line, f"module {ref.symbol}: {ref.target} does not exist"))
            continue
        declared = declared_params(parse(target))
        if not ref.params_given:
            continue
        for name, line in sorted(ref.params.items()):
            if name not in declared:
                found.append(Finding(str(path), line, f"module {ref.symbol}: unknown param {name!r} "
                                     f"({ref.target} declares {', '.join(sorted(declared)) or 'none'})"))
        for name in sorted(p.name for p in declared.values() if p.required and p.name not in ref.params):
            found.append(Finding(str(path), ref.line, f"module {ref.symbol}: required param {name!r} "
                                 f"of {ref.target} not passed"))
    return found


def check_bicepparam(path: Path, tree: ts.Tree) -> List[Finding]:
    using = next((n for n in tree.root_node.children if n.type == "using_statement"), None)
    if using is None:
        return [Finding(str(path), 1, "no `using` statement")]
    target_text = next((string_value(c) for c in using.children if c.type == "string"), None) or ""
    target = (path.parent / target_text).resolve()
    if not target.is_file():
        return [Finding(str(path), line_of(using), f"using target {target_text!r} does not exist")]
    declared = declared_params(parse(target))
    found = []
    given: Set[str] = set()
    for node in tree.root_node.children:
        if node.type != "variable_declaration":    # a rewritten `param name = value`
            continue
        name = name_of(node) or ""
        given.add(name)
        if name not in declared:
            message = f"param {name!r} is not declared in {target_text}"
            found.append(Finding(str(path), line_of(node), message))
    for name in sorted(p.name for p in declared.values() if p.required and p.name not in given):
        found.append(Finding(str(path), line_of(using), f"required param {name!r} of {target_text} not set"))
    return found


def check_file(path: Path) -> List[Finding]:
    tree = parse(path)
    errors = syntax_errors(path, tree)
    if errors:
        return errors
    if path.suffix == ".bicepparam":
        return check_bicepparam(path, tree)
    return check_module_refs(path, tree) + undeclared(path, tree) + warnings(path, tree)


def bicep_files(root: Path) -> List[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".bicep", ".bicepparam") and p.is_file())


def check_tree(root: Path) -> List[Finding]:
    findings: List[Finding] = []
    for path in bicep_files(root):
        findings.extend(check_file(path))
    return findings


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0] if args else "infra")
    files = bicep_files(root)
    findings = check_tree(root)
    for finding in findings:
        print(finding)
    print(f"{len(files)} Bicep file(s), {len(findings)} finding(s)")
    return 1 if findings or not files else 0


if __name__ == "__main__":
    raise SystemExit(main())

