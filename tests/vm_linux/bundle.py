"""The Linux bundle the VMs install: `python -m tools.wheelhouse` (what `make wheelhouse` runs), for the
two Pythons the test roots have (3.9 on Debian 11, 3.11 on Debian 12), with `--with-sdk` (the sandbox is
reached by connection strings), built once and kept under the cache, keyed by a hash of everything that
goes into it. A "newer" bundle for the upgrade test is the same
bundle with the forwarder wheel built from the same sources at a higher version.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .rootfs import CACHE

REPO = Path(__file__).resolve().parents[2]
PYTHONS = ("3.9.2", "3.11")
BUNDLE = "se-forwarder-linux.tar.gz"
SCRIPT = "install-forwarder.sh"
# What the bundle's behaviour depends on (docs/forwarder.md is carried in it but runs nothing: an edit of
# it does not rebuild the bundle here).
INPUTS = ("pyproject.toml", "forwarder", "schemas", "infra/forwarder", "tools/wheelhouse.py")


def _key() -> str:
    digest = hashlib.sha256(" ".join(PYTHONS).encode())
    for name in INPUTS:
        path = REPO / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            if "__pycache__" in f.parts:
                continue
            digest.update(f.relative_to(REPO).as_posix().encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def linux_bundle() -> Path:
    """A directory holding se-forwarder-linux.tar.gz and install-forwarder.sh, as the CustomScript
    extension downloads them."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / f"bundle-{_key()}"
    with open(CACHE / "bundle.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / BUNDLE).is_file() and (out / SCRIPT).is_file():
            return out
        building = out.with_name(out.name + ".build")
        shutil.rmtree(building, ignore_errors=True)
        # --with-sdk: the Azure SDKs for connection strings (the sandbox's hub and Azurite); production
        # bundles leave them out (infra/forwarder/requirements-vm-sdk.txt)
        subprocess.run([sys.executable, "-m", "tools.wheelhouse", "--out", str(building), "--target", "linux",
                        "--with-sdk", "--python", *PYTHONS], cwd=REPO, check=True, timeout=1200)
        building.rename(out)
        for stale in CACHE.glob("bundle-*"):  # this module's bundles of older sources: never used again
            if stale.is_dir() and stale != out and re.fullmatch(r"bundle-[0-9a-f]{16}", stale.name):
                shutil.rmtree(stale, ignore_errors=True)
        return out


def _repack(bundle_dir: Path, stage: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest / BUNDLE, "w:gz") as tar:
        for item in sorted(stage.iterdir()):
            tar.add(item, arcname=item.name)
    shutil.copy2(bundle_dir / SCRIPT, dest / SCRIPT)


def broken_bundle(bundle_dir: Path, dest: Path, missing: str = "requests-") -> None:
    """The bundle without one pinned wheel: pip cannot build the release (a failed upgrade)."""
    with tempfile.TemporaryDirectory(prefix="se-broken-") as tmp:
        stage = Path(tmp)
        with tarfile.open(bundle_dir / BUNDLE) as tar:
            tar.extractall(stage)  # noqa: S202 - our own bundle
        for wheel in (stage / "wheels").glob(f"{missing}*.whl"):
            wheel.unlink()
        _repack(bundle_dir, stage, dest)


def newer_bundle(bundle_dir: Path, dest: Path, suffix: str = ".post1") -> str:
    """Write into `dest` the bundle of `bundle_dir` with the forwarder at <version><suffix>. Returns that
    version."""
    text = (REPO / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', text, flags=re.M).group(1)  # type: ignore[union-attr]
    newer = version + suffix
    with tempfile.TemporaryDirectory(prefix="se-newer-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, src / name)
        for name in ("forwarder", "schemas"):
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        (src / "pyproject.toml").write_text(text.replace(f'version = "{version}"', f'version = "{newer}"', 1))
        init = src / "forwarder" / "__init__.py"
        init.write_text(init.read_text().replace(f'"{version}"', f'"{newer}"', 1))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "-w", str(Path(tmp) / "w"), str(src)], check=True, timeout=300)
        stage = Path(tmp) / "stage"
        with tarfile.open(bundle_dir / BUNDLE) as tar:
            tar.extractall(stage)  # noqa: S202 - our own bundle
        for old in (stage / "wheels").glob("scheduled_events_forwarder-*.whl"):
            old.unlink()
        for wheel in (Path(tmp) / "w").glob("*.whl"):
            shutil.copy2(wheel, stage / "wheels")
        _repack(bundle_dir, stage, dest)
    return newer
