"""TLS trust for the forwarder's AMQP and HTTPS clients: the VM's own hashed CA directory (OpenSSL's
`capath`, e.g. /etc/ssl/certs), where OpenSSL loads a CA only when a chain needs it. The SDKs' default
loads certifi's whole bundle (~140 certificates, +1.5 MB of RSS) into every connection."""

from __future__ import annotations

import functools
import os
import re
import ssl
from typing import Optional

_HASHED = re.compile(r"^[0-9a-f]{8}\.[0-9]+$")


def hashed_ca_dir() -> Optional[str]:
    """The OS's hashed CA directory (SSL_CERT_DIR or OpenSSL's default), or None when there is none."""
    capath = ssl.get_default_verify_paths().capath
    try:
        hashed = bool(capath) and any(_HASHED.match(name) for name in os.listdir(capath))
    except OSError:
        hashed = False
    return capath if hashed else None


def tls_context() -> Optional[ssl.SSLContext]:
    """A verifying client context over the OS's hashed CA directory, looked up lazily; None when there
    is none (then the SDK's default, certifi's bundle)."""
    capath = hashed_ca_dir()
    if capath is None:
        return None
    context = ssl.create_default_context(capath=capath)  # verifies the peer and its host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def client_context() -> ssl.SSLContext:
    """The process's one verifying client context for the REST clients (Event Hubs, the approval queue):
    tls_context() over the hashed CA directory, else Python's default trust. Made once per CA directory:
    a context per connection re-read the CA store at every reconnect (each heartbeat after an idle close)."""
    return _made_for(hashed_ca_dir())


@functools.lru_cache(maxsize=4)
def _made_for(capath: Optional[str]) -> ssl.SSLContext:
    return tls_context() or ssl.create_default_context()
