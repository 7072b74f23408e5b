"""No secret in the repository: detect-secrets over every tracked file, against the reviewed
`.secrets.baseline` (each entry there was looked at and marked is_secret false). A new finding fails
`make test`; to accept a false positive, audit it into the baseline (docs/security.md says how)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Dict, Set, Tuple

from detect_secrets import SecretsCollection
from detect_secrets.settings import transient_settings

from sandbox import processes

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / ".secrets.baseline"
# Azurite's published development key (the same on every machine, documented by Microsoft): allowed
# only where the local stand-ins and their tests live, never in what ships (forwarder/, central/, infra/).
AZURITE_KEY = processes.AZURITE_KEY
AZURITE_ALLOWED = ("sandbox/", "tests/", "docs/", "bench/")


def _settings() -> Dict:
    baseline = json.loads(BASELINE.read_text("utf-8"))
    return {"plugins_used": baseline["plugins_used"], "filters_used": baseline["filters_used"]}


def scan(paths: list, root: Path = REPO) -> Set[Tuple[str, str, str]]:
    """(file, type, hashed secret) for every finding in `paths` (relative to root)."""
    found = set()
    with transient_settings(_settings()):
        collection = SecretsCollection(root=str(root))
        for path in paths:
            collection.scan_file(str(path))
        for filename, secret in collection:
            found.add((filename, secret.type, secret.secret_hash))
    return found


def tracked_files() -> list:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    # The baseline itself holds only hashes of reviewed findings (which look like hex secrets).
    return [p for p in out.decode().split("\0") if p and p != ".secrets.baseline" and (REPO / p).is_file()]


def test_no_secret_in_tracked_files_beyond_the_reviewed_baseline() -> None:
    files = tracked_files()
    assert len(files) > 50  # the scan really covers the repo
    baseline = json.loads(BASELINE.read_text("utf-8"))
    reviewed = {(f, s["type"], s["hashed_secret"]) for f, items in baseline["results"].items() for s in items
                if s.get("is_secret") is False}
    new = scan(files) - reviewed
    assert not new, ("possible secrets in tracked files (remove them, or audit a false positive into "
                     f".secrets.baseline): {sorted(new)}")


def test_the_scan_flags_a_planted_key(tmp_path: Path) -> None:
    """The check can fail: fake credentials in a file are found by the same scan."""
    planted = tmp_path / "settings.py"
    # Assembled at run time, so this source file itself holds no scannable key.
    aws_id = "AKIA" + "Z7QW4RT2XJ5LMN3P"
    storage_key = "".join((
        "q8VmZ3x0L2pT9sR4wYbN6cE1uJ7",  # pragma: allowlist secret
        "hK5dA0fG3iO8lM2nB4vC6xZ9yQ1tP7rS5uW==",  # pragma: allowlist secret
    ))
    planted.write_text(f'AWS_ACCESS_KEY_ID = "{aws_id}"\nstorage_key = "{storage_key}"\n', encoding="utf-8")
    found = scan([planted.name], root=tmp_path)
    assert {t for _, t, _ in found} >= {"AWS Access Key"}
    assert any(t in ("Base64 High Entropy String", "Secret Keyword") for _, t, _ in found)


def test_azurite_dev_key_only_in_local_stand_ins() -> None:
    holders = [p for p in tracked_files()
               if p != ".secrets.baseline" and AZURITE_KEY in (REPO / p).read_text("utf-8", errors="ignore")]
    assert holders, "the allowlist test must see at least sandbox/processes.py"
    assert all(p.startswith(AZURITE_ALLOWED) for p in holders), holders
