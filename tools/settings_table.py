"""The README's one table of every setting: the forwarder's (flag / env / config key) and the
Function app's (app settings), generated from the two sources of truth so the README stays true.

    python -m tools.settings_table            # print the table
    python -m tools.settings_table --write    # replace the block between the markers in README.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from forwarder.config import SETTINGS

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- settings-table:begin -->", "<!-- settings-table:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table() -> str:
    lines = [
        "| where | setting (flag · env var · config key / app setting) | default | meaning |",
        "|---|---|---|---|",
    ]
    for s in SETTINGS:
        default = f"`{_cell(s.default_text)}`" if s.default_text else ""  # as typed: false, Preempt,Terminate
        flag = f"`{s.flag}` / `--no-{s.flag[2:]}`" if s.is_switch else f"`{s.flag}`"
        name = f"{flag} · `{s.env}` · `{s.key}`"
        lines.append(f"| VM: forwarder | {name} | {default} | {_cell(s.help)} |")
    app = json.loads((REPO / "central" / "app_settings.json").read_text(encoding="utf-8"))
    for name, meaning in app["settings"].items():
        lines.append(f"| Function app | `{name}` | | {_cell(meaning)} |")
    return "\n".join(lines)


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the README block in place")
    args = parser.parse_args(argv)
    if not args.write:
        print(table())
        return 0
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    readme.write_text(text[:start] + block() + text[stop:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
