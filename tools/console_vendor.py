"""Copy @azure/msal-browser's browser build from node_modules into the console's served folder
(central/console/vendor/), so it ships inside the Functions deployment package (.funcignore keeps
node_modules out). Run by `make bootstrap` and by azd's prepackage hook (infra/hooks/console-vendor.sh).

The version copied must be the one package-lock.json pins; exit 2 (one line) when node_modules lacks it or
holds another version: run `npm ci` first.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "@azure/msal-browser"
SOURCE = Path("node_modules") / PACKAGE / "lib" / "msal-browser.min.js"
TARGET = Path("central") / "console" / "vendor" / "msal-browser.min.js"


def locked_version(repo: Path = REPO) -> str:
    lock = json.loads((repo / "package-lock.json").read_text(encoding="utf-8"))
    return str(lock["packages"][f"node_modules/{PACKAGE}"]["version"])


def copy(repo: Path = REPO) -> Path:
    """The copied file; ValueError (what to run) when it is not installed, or not the locked version."""
    want = locked_version(repo)
    manifest = repo / "node_modules" / PACKAGE / "package.json"
    if not manifest.exists():
        raise ValueError(f"{PACKAGE} is not installed: run `npm ci` (package-lock.json pins {want})")
    have = json.loads(manifest.read_text(encoding="utf-8"))["version"]
    if have != want:
        raise ValueError(f"node_modules has {PACKAGE} {have}, package-lock.json pins {want}: run `npm ci`")
    target = repo / TARGET
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo / SOURCE, target)
    (target.parent / "VERSION").write_text(f"{PACKAGE} {want}\n", encoding="utf-8")
    return target


def main(argv: Optional[List[str]] = None) -> int:
    try:
        target = copy()
    except (ValueError, OSError, KeyError) as exc:
        print(f"console_vendor: {exc}", file=sys.stderr)
        return 2
    print(f"console_vendor: {PACKAGE} {locked_version()} -> {target.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
