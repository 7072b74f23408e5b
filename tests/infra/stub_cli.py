"""Stand-ins for the `az` and `azd` executables, for tests that run the real install script in real bash.

Each answers from a "world" JSON file (STUB_WORLD) of recorded outputs and appends every call to a log
(STUB_LOG, one JSON array of argv per line). `az` applies --query with jmespath, the library az itself
uses (dicts kept in order, as az does), and prints -o tsv / json / none the way az does: a list is one row
per item, a row's values are tab-separated, null inside a row prints None, a null result prints nothing.
An az command with no recording fails like az does (exit 1, "ERROR: ..." on stderr).

World: {"az": [{"command": "vm show", "options": {"--name": "web-01"}, "result": {...}}
               | {"command": ..., "error": "...", "exit": 3}, ...],
        "azd": {"default": "se-prod", "envs": {"se-prod": "KEY=\"value\"\\n..."}}}
"""

from __future__ import annotations

import json
import os
import sys
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import jmespath

ALIASES = {"-n": "--name", "-g": "--resource-group", "-o": "--output", "-f": "--template-file",
           "-p": "--parameters", "-e": "--environment"}
FLAGS = {"--yes", "--no-wait", "--debug", "--verbose", "--only-show-errors"}


def split(argv: List[str]) -> Tuple[str, Dict[str, List[str]]]:
    """Command words, then options (an option repeated or taking many values keeps them all)."""
    words: List[str] = []
    options: Dict[str, List[str]] = {}
    current: Optional[str] = None
    for arg in argv:
        if arg.startswith("-") and len(arg) > 1 and not arg.lstrip("-")[:1].isdigit():
            current = ALIASES.get(arg, arg)
            options.setdefault(current, [])
            if current in FLAGS:
                current = None
        elif current is not None:
            options[current].append(arg)
        else:
            words.append(arg)
    return " ".join(words), options


def tsv(result: Any) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, list):
            return str(len(value))
        if isinstance(value, dict):
            return ""
        return value if isinstance(value, str) else str(value)

    lines = []
    for row in (result if isinstance(result, list) else [result]):
        if isinstance(row, dict):
            lines.append("\t".join(cell(v) for v in row.values()))
        elif isinstance(row, list):
            lines.append("\t".join(cell(v) for v in row))
        elif isinstance(row, bool):
            lines.append(str(row).lower())
        else:
            lines.append(cell(row))
    return "".join(line + "\n" for line in lines)


def az(world: Dict[str, Any], argv: List[str]) -> int:
    command, options = split(argv)
    for entry in world.get("az", []):
        if entry["command"] != command:
            continue
        if any(options.get(k, [None])[0] != v for k, v in entry.get("options", {}).items()):
            continue
        if "error" in entry:
            print(f"ERROR: {entry['error']}", file=sys.stderr)
            return int(entry.get("exit", 1))
        result = json.loads(json.dumps(entry.get("result")), object_pairs_hook=OrderedDict)
        query = options.get("--query", [None])[0]
        if query:
            result = jmespath.search(query, result, options=jmespath.Options(dict_cls=OrderedDict))
        output = options.get("--output", ["json"])[0]
        if result is None or output == "none":
            return 0
        sys.stdout.write(tsv(result) if output == "tsv" else json.dumps(result, indent=2) + "\n")
        return 0
    print(f"ERROR: (stub) no recording for: az {' '.join(argv)}", file=sys.stderr)
    return 1


def azd(world: Dict[str, Any], argv: List[str]) -> int:
    command, options = split(argv)
    recorded = world.get("azd")
    if command != "env get-values" or not recorded:
        print("ERROR: no project exists; to create a new project, run `azd init`", file=sys.stderr)
        return 1
    name = options.get("--environment", [recorded.get("default")])[0]
    if name not in recorded.get("envs", {}):
        print(f"ERROR: environment '{name}' does not exist", file=sys.stderr)
        return 1
    sys.stdout.write(recorded["envs"][name])
    return 0


def main() -> int:
    tool, argv = sys.argv[1], sys.argv[2:]
    with open(os.environ["STUB_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps([tool, *argv]) + "\n")
    with open(os.environ["STUB_WORLD"], encoding="utf-8") as handle:
        world = json.load(handle)
    return az(world, argv) if tool == "az" else azd(world, argv)


if __name__ == "__main__":
    raise SystemExit(main())
