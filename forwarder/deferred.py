"""Imports the forwarder's dependencies make at load time for code a VM never runs, deferred to first use
(docs/forwarder.md, "Footprint"). `install()` is called by `run` and `check`, before anything is imported.

The ONE module that knows the dependencies' private module names; tests/forwarder/test_deferred.py fails
when a dependency changes under it. Each entry was measured on the pinned VM install (python -X
importtime, RSS from /proc, bench forwarder_footprint):

- `azure.storage.queue._encryption` (client-side encryption, which the forwarder never configures)
  imports six names from `cryptography` at module level, and with them cryptography's whole Rust/OpenSSL
  binding: +6.5 MiB of RSS from the first approval on.
- `urllib3.http2` imports `importlib.metadata` (zipfile, csv, email...) for a version check that runs
  only when a program opts in to HTTP/2, and msal's `oauth2cli` imports its interactive-login code
  (`authcode`: http.server, html, socketserver) for browser sign-in, which a managed identity never
  does: together ~1 MiB idle; azure-core's `_pipeline_transport_rest_shared` imports `email.policy`
  (email's header registry and parser) for multipart batch requests, which the forwarder never sends:
  ~0.4 MiB idle.
- `azure.storage.queue._shared.authentication` asks azure-core for `AioHttpTransport` (for its async
  clients); azure-core imports asyncio (+1.9 MiB) before it finds aiohttp missing, as it is on a VM.

How: while one of the IMPORTERS below is executed, the names it imports from the modules listed for it
come back as `Deferred` stand-ins, each the real class or function imported on first call or attribute
look-up, so the code works exactly as before if it ever runs (an encrypted message, a browser login);
it is just never paid for by a VM that does not. `sys.modules` is not touched; a source module that is
already loaded is imported as it is. azure-core's aiohttp transport is marked absent (the probe then
fails at once, as it would anyway without aiohttp; the forwarder has no async client).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any, Dict, FrozenSet, Optional, Sequence, Tuple

AIOHTTP_TRANSPORT = "azure.core.pipeline.transport._aiohttp"
# importer -> {module it imports from (absolute): the names it takes}; the test reads each importer's
# source and fails when its imports no longer match.
IMPORTERS: Dict[str, Dict[str, FrozenSet[str]]] = {
    "azure.storage.queue._encryption": {
        "cryptography.hazmat.backends": frozenset({"default_backend"}),
        "cryptography.hazmat.primitives.ciphers": frozenset({"Cipher"}),
        "cryptography.hazmat.primitives.ciphers.aead": frozenset({"AESGCM"}),
        "cryptography.hazmat.primitives.ciphers.algorithms": frozenset({"AES"}),
        "cryptography.hazmat.primitives.ciphers.modes": frozenset({"CBC"}),
        "cryptography.hazmat.primitives.padding": frozenset({"PKCS7"}),
    },
    "azure.core.utils._pipeline_transport_rest_shared": {"email.policy": frozenset({"HTTP"})},
    "urllib3.http2": {"importlib.metadata": frozenset({"version"})},
    # jsonschema < 4.26 (the VM pin: 4.26 needs Python 3.10) imports urlopen at load, for remote $refs
    # the forwarder's registry never fetches: urllib.request with it, +1.1 MiB idle (issue 49).
    "jsonschema.validators": {"urllib.request": frozenset({"urlopen"})},
    "msal": {"msal.application": frozenset({"ClientApplication", "ConfidentialClientApplication",
                                            "PublicClientApplication"})},
    "msal.oauth2cli": {"msal.oauth2cli.authcode": frozenset({"AuthCodeReceiver"})},
    "msal.oauth2cli.oauth2": {"msal.oauth2cli.authcode": frozenset({"AuthCodeReceiver"})},
    "msal.application": {"msal.oauth2cli.authcode": frozenset({"is_wsl"})},
}
# importer -> the distribution and the first version that no longer makes the import at load time (the
# entry is then moot: the test checks the import is gone, not that it matches).
GONE_SINCE: Dict[str, Tuple[str, str]] = {"jsonschema.validators": ("jsonschema", "4.26")}


class Deferred:
    """Stands for `module.name` and imports it when first called or looked into."""

    def __init__(self, module: str, name: str) -> None:
        self._where = (module, name)
        self._real: Any = None

    def resolve(self) -> Any:
        if self._real is None:
            module, name = self._where
            self._real = getattr(importlib.import_module(module), name)
        return self._real

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.resolve(), attr)

    def __repr__(self) -> str:
        return f"<deferred {'.'.join(self._where)}>"


def deferring_import(table: Dict[str, FrozenSet[str]]) -> Any:
    """An `__import__` that returns `table`'s names as Deferred (when their module is not loaded yet)
    and does every other import as the real one."""

    def _import(name: str, globals: Any = None, locals: Any = None,  # __import__'s own names
                fromlist: Sequence[str] = (), level: int = 0) -> Any:
        absolute = name
        if level and globals:
            absolute = importlib.util.resolve_name("." * level + name, globals.get("__package__") or "")
        wanted = table.get(absolute)
        if wanted and fromlist and set(fromlist) <= wanted and absolute not in sys.modules:
            namespace = ModuleType(absolute)
            for item in fromlist:
                setattr(namespace, item, Deferred(absolute, item))
            return namespace
        return builtins.__import__(name, globals, locals, fromlist, level)

    return _import


class _DeferringLoader:
    def __init__(self, real: importlib.machinery.SourceFileLoader, table: Dict[str, FrozenSet[str]]) -> None:
        self.real = real
        self.table = table

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # The module's own builtins: its import lines run through deferring_import (exec() keeps a
        # `__builtins__` the globals already have; functions defined there keep using it).
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": deferring_import(self.table)}
        self.real.exec_module(module)


class _Finder:
    """A meta-path finder for the IMPORTERS only: the usual spec, with the loader wrapped."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        table = IMPORTERS.get(fullname)
        if table is None or all(source in sys.modules for source in table):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None  # e.g. a zipped or frozen install: imported as it is
        spec.loader = _DeferringLoader(spec.loader, table)  # type: ignore[assignment]
        return spec


def install() -> bool:
    """Defer the IMPORTERS' imports from now on. False (nothing done) if any importer is loaded already."""
    if any(name in sys.modules for name in IMPORTERS):
        return False
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())  # type: ignore[arg-type]
    if AIOHTTP_TRANSPORT not in sys.modules:
        sys.modules[AIOHTTP_TRANSPORT] = None  # type: ignore[assignment]  # None: "import fails", by design
    return True
