"""The import rules of the code tree, checked from the source (docs/architecture.md draws them).

Every import counts: module level, inside a function, and under `if TYPE_CHECKING:` (a cycle dodged by
a lazy or type-only import is still a cycle in the design). Two checks:
- layers: a central/ package imports only the packages LAYERS allows it (and never the forwarder, and
  the forwarder never imports central);
- cycles: no import cycle among the modules of central/, forwarder/, schemas/ and tools/.

`python -m tools.import_layers` prints every violation (exit 1) or nothing (exit 0).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("central", "forwarder", "schemas", "tools")

# central's packages and what each may import (besides itself, schemas/ and third-party libraries).
# The order is the data's: records, then the pure policy, the store, intake, the runtime that wires
# them, and the operators' command-line tools, which nothing in central imports.
LAYERS: Dict[str, Set[str]] = {
    "central.model": set(),
    "central.policy": {"central.model"},
    "central.store": {"central.model"},
    "central.telemetry": set(),
    "central.intake": {"central.model", "central.policy", "central.store", "central.telemetry"},
    "central.runtime": {"central.model", "central.policy", "central.store", "central.intake",
                        "central.telemetry"},
    "central.cli": {"central.model", "central.policy", "central.store", "central.intake"},
}
# Outside central: who may import central at all (function_app.py only its runtime's public face).
ENTRY_POINTS = {"function_app": {"central.runtime"}}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (a project module, resolved)
    line: int


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path = REPO) -> Dict[str, Path]:
    mods = {module_name(p, root): p for top in CHECKED for p in (root / top).rglob("*.py")}
    if (root / "function_app.py").exists():
        mods["function_app"] = root / "function_app.py"
    return mods


def _imports(name: str, path: Path, modules: Dict[str, Path]) -> Iterator[Edge]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target:
                    yield Edge(name, target, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                # `from pkg import mod` imports the module; `from mod import name` the module it is in
                target = _resolve(f"{base}.{alias.name}", modules) if f"{base}.{alias.name}" in modules \
                    else _resolve(base, modules)
                if target:
                    yield Edge(name, target, node.lineno)


def _resolve(dotted: str, modules: Dict[str, Path]) -> str:
    """The project module `dotted` names (or the nearest enclosing one), '' for a library."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return ""


def edges(root: Path = REPO) -> List[Edge]:
    modules = project_modules(root)
    return [e for name, path in sorted(modules.items()) for e in _imports(name, path, modules)
            if e.target != name]


def package_of(module: str) -> str:
    """central.<package> for a module inside one of central's packages, else the top-level name."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "central" and len(parts) > 1 else parts[0]


def layer_violations(all_edges: List[Edge]) -> List[str]:
    out = []
    for e in all_edges:
        src, dst = package_of(e.source), package_of(e.target)
        where = f"{e.source} (line {e.line}) imports {e.target}"
        if src == dst or dst == "schemas":
            continue
        if src == "central" or dst == "central":  # central/__init__ is a map: it imports nothing
            out.append(f"{where}: central/__init__.py is documentation only")
        elif src in LAYERS:
            if dst not in LAYERS[src]:
                out.append(f"{where}: {src} may import only {sorted(LAYERS[src]) or 'nothing of central'}")
        elif src in ENTRY_POINTS:
            if dst.startswith("central") and e.target not in ENTRY_POINTS[src]:
                out.append(f"{where}: {src} may import only the public face {sorted(ENTRY_POINTS[src])}")
        elif dst.startswith("central") or (src.startswith("central") and dst == "forwarder"):
            out.append(f"{where}: {src} may not import {dst}")
    return out


def cycles(all_edges: List[Edge]) -> List[List[str]]:
    """The import cycles (strongly connected components of more than one module, or a self-loop),
    each as a sorted list of module names (Tarjan's algorithm, iterative)."""
    graph: Dict[str, Set[str]] = {}
    for e in all_edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: List[Tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def problems(root: Path = REPO) -> List[str]:
    all_edges = edges(root)
    out = layer_violations(all_edges)
    out += [f"import cycle: {' <-> '.join(c)}" for c in cycles(all_edges)]
    return out


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
