"""forwarder/deferred.py: what it defers is what the dependencies import today (these tests fail when an
SDK changes under it), a forwarder process does not load it, and the deferred code still works when run."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, FrozenSet, List, Set, Tuple

import pytest

from forwarder import deferred
from sandbox import processes


def _top_level_imports(module: str) -> Dict[str, Set[str]]:
    """{absolute module: names} of the `from X import names` a module runs when loaded (not the ones
    under `if TYPE_CHECKING:` nor inside functions)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is gone: forwarder/deferred.py must follow the SDK"
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    package = module if spec.submodule_search_locations else module.rpartition(".")[0]
    found: Dict[str, Set[str]] = {}

    def visit(nodes: List[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                name = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                    if node.level else str(node.module)
                found.setdefault(name, set()).update(alias.name for alias in node.names)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.dump(node.test):
                visit(node.body)
                visit(node.orelse)

    visit(tree.body)
    return found


def _family(source: str) -> str:
    """What an importer must import only through the table: any of cryptography (its Rust binding loads
    with every submodule), or else the deferred module itself."""
    return "cryptography." if source.startswith("cryptography.") else source


def _version_tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def _version(distribution: str) -> Tuple[int, ...]:
    from importlib.metadata import version

    return _version_tuple(version(distribution))


@pytest.mark.parametrize("importer", sorted(deferred.IMPORTERS))
def test_the_table_matches_what_each_importer_imports(importer: str) -> None:
    table: Dict[str, FrozenSet[str]] = deferred.IMPORTERS[importer]
    imports = _top_level_imports(importer)
    gone = deferred.GONE_SINCE.get(importer)
    if gone is not None and _version(gone[0]) >= _version_tuple(gone[1]):
        assert not set(table) & set(imports), f"{importer} imports {sorted(set(table) & set(imports))} again"
        return
    for source, names in table.items():
        assert imports.get(source) == set(names), (
            f"{importer} now imports {sorted(imports.get(source, ()))} from {source}, the table says "
            f"{sorted(names)}: update forwarder/deferred.py (and re-measure)")
    families = {_family(source) for source in table}
    untabled = {m for m in imports for f in families if (m == f or m.startswith(f)) and m not in table}
    assert not untabled, f"{importer} also imports {sorted(untabled)} at load time: deferring saves nothing"


PROBE = r"""
import json, sys
from forwarder import deferred, footprint
footprint.skip_charset_detection()
assert deferred.install()
import azure.eventhub, msal, requests
from azure.storage.queue import QueueClient
idle = sorted(m for m in ("cryptography", "asyncio", "importlib.metadata", "http.server", "msal.application",
                          "msal.oauth2cli.authcode", "email.policy") if m in sys.modules)

# The deferred code, run: the queue SDK's client-side encryption (AES-CBC v1 and AES-GCM v2) ...
import base64, os
from azure.storage.queue import _encryption
class Kek:  # a key-encryption key that does not wrap (test only): the content key travels as it is
    def wrap_key(self, key): return key
    def get_key_wrap_algorithm(self): return "none"
    def get_kid(self): return "k1"
out = {}
for version in ("1.0", "2.0"):
    sealed = json.loads(_encryption.encrypt_queue_message("approve E1", Kek(), version))
    data = sealed["EncryptionData"]
    key = base64.b64decode(data["WrappedContentKey"]["EncryptedKey"])
    content = base64.b64decode(sealed["EncryptedMessageContents"])
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes, aead
    from cryptography.hazmat.primitives import padding
    if version == "1.0":
        iv = base64.b64decode(data["ContentEncryptionIV"])
        plain = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor().update(content)
        unpadder = padding.PKCS7(128).unpadder()
        out[version] = (unpadder.update(plain) + unpadder.finalize()).decode()
    else:
        # v2 wraps the protocol version (8 bytes) with the key
        out[version] = aead.AESGCM(key[-32:]).decrypt(content[:12], content[12:], None).decode()
# ... msal's interactive parts and urllib3's HTTP/2 check resolve to the real things
import msal.application, urllib3.http2
out["is_wsl"] = msal.application.is_wsl() in (True, False)
out["app"] = isinstance(msal.PublicClientApplication.resolve(), type)
out["version"] = urllib3.http2.version("urllib3") == __import__("urllib3").__version__
# ... and azure-core's multipart serializer writes with email's HTTP policy as before
from azure.core.utils import _pipeline_transport_rest_shared as shared
message = shared.Message()
message.add_header("Content-Type", "application/http")
message.set_payload("GET /x HTTP/1.1\r\n\r\n")
import email.policy
out["policy"] = message.as_bytes(policy=shared.HTTP) == message.as_bytes(policy=email.policy.HTTP)
print(json.dumps({"idle": idle, "ran": out}))
"""


def test_a_forwarder_process_loads_none_of_it_and_the_deferred_code_still_works() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          cwd=processes.REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["idle"] == [], report["idle"]
    assert report["ran"] == {"1.0": "approve E1", "2.0": "approve E1", "is_wsl": True, "app": True,
                             "version": True, "policy": True}


def test_install_does_nothing_once_an_importer_is_loaded() -> None:
    import msal  # noqa: F401 - loaded in this test process already

    assert deferred.install() is False
    assert not any(isinstance(f, deferred._Finder) for f in sys.meta_path)
