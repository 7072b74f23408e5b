"""Fetch a CA certificate from an AIA "CA Issuers" URL: the one network call of sender authentication.

A signer certificate names where its issuer can be downloaded. Central follows that only:
- to allowlisted hosts (Microsoft's and DigiCert's CA-certificate hosts by default; a host matches
  exactly, or as a subdomain of an entry that starts with a dot);
- over plain HTTP, as AIA URLs are (RFC 5280 4.2.2.1; TLS to fetch a CA certificate would be circular),
  with no redirects: integrity comes from the chain, a fetched certificate is only used if it signs
  what it must, up to a trusted root;
- to public addresses only: every address the host resolves to is checked and the connection goes to
  that checked address (no second lookup an attacker could answer differently). Private, link-local
  (the IMDS address itself), multicast and reserved addresses are always refused; a loopback address
  only when the allowlist names that literal IP (tests run a local server that way);
- with a timeout and a size cap;
- cached: a certificate for CACHE_SECONDS, a failure for FAILURE_SECONDS (so a burst of envelopes
  with an unreachable issuer costs one attempt, not one each).
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import socket
import threading
import time
import urllib.parse
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs7

log = logging.getLogger("central.aia")

DEFAULT_HOSTS: Tuple[str, ...] = (
    "www.microsoft.com", "caissuers.microsoft.com", "crt.microsoft.com", "cacerts.digicert.com",
    "cacerts.geotrust.com", "cacerts.thawte.com",
)
TIMEOUT_SECONDS = 5.0
MAX_BYTES = 64 * 1024     # a CA certificate is ~2 KB; a .p7c bundle a few
CACHE_SECONDS = 24 * 3600.0
FAILURE_SECONDS = 300.0
MAX_ENTRIES = 256

Resolve = Callable[[str, int], Sequence[str]]


class FetchError(Exception):
    """Why a URL was not fetched (one line)."""


def _resolve(host: str, port: int) -> List[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


class AiaFetcher:
    """`fetcher(url)` -> the certificates at url; raises FetchError. Thread-safe; one per process."""

    def __init__(self, hosts: Sequence[str] = DEFAULT_HOSTS, timeout: float = TIMEOUT_SECONDS,
                 max_bytes: int = MAX_BYTES, resolve: Resolve = _resolve,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts = tuple(h.strip().lower() for h in hosts if h.strip())
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.resolve = resolve
        self.clock = clock
        self.fetched = 0      # network fetches attempted (figures for health and tests)
        self._cache: Dict[str, Tuple[float, Optional[List[x509.Certificate]], str]] = {}
        self._lock = threading.Lock()

    def __call__(self, url: str) -> List[x509.Certificate]:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(url)
        if hit is not None and hit[0] > now:
            if hit[1] is None:
                raise FetchError(hit[2])
            return list(hit[1])
        try:
            certs = self._fetch(url)
        except FetchError as exc:
            log.warning("AIA fetch of %s refused or failed: %s", url, exc)
            self._put(url, (now + FAILURE_SECONDS, None, str(exc)))
            raise
        self._put(url, (now + CACHE_SECONDS, certs, ""))
        return list(certs)

    def _put(self, url: str, entry: Tuple[float, Optional[List[x509.Certificate]], str]) -> None:
        with self._lock:
            if len(self._cache) >= MAX_ENTRIES:
                self._cache.clear()
            self._cache[url] = entry

    def allowed_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == h or (h.startswith(".") and host.endswith(h)) for h in self.hosts)

    def _fetch(self, url: str) -> List[x509.Certificate]:
        parts = urllib.parse.urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme != "http" or not host:
            raise FetchError(f"not an http URL: {url[:120]}")
        if not self.allowed_host(host):
            raise FetchError(f"host {host!r} is not on the AIA allowlist")
        port = parts.port or 80
        address = self._checked_address(host, port)
        self.fetched += 1
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = http.client.HTTPConnection(address, port, timeout=self.timeout)
        try:
            conn.request("GET", path, headers={"Host": host, "Accept": "*/*", "User-Agent": "se-central-aia"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise FetchError(f"{url[:120]} answered HTTP {resp.status}")
            body = resp.read(self.max_bytes + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise FetchError(f"{url[:120]}: {type(exc).__name__}: {exc}") from None
        finally:
            conn.close()
        if len(body) > self.max_bytes:
            raise FetchError(f"{url[:120]} is over {self.max_bytes} bytes")
        return parse_certificates(body, url)

    def _checked_address(self, host: str, port: int) -> str:
        literal = _ip(host)
        try:
            addresses = [host] if literal else list(self.resolve(host, port))
        except OSError as exc:
            raise FetchError(f"cannot resolve {host}: {exc}") from None
        if not addresses:
            raise FetchError(f"{host} resolves to no address")
        for text in addresses:
            ip = _ip(text)
            if ip is None:
                raise FetchError(f"{host} resolves to {text!r}, not an IP address")
            if ip.is_loopback and literal is not None and host in self.hosts:
                continue  # an operator (or a test) named this loopback literal explicitly
            if (ip.is_private or ip.is_link_local or ip.is_loopback or ip.is_multicast or ip.is_reserved
                    or ip.is_unspecified):
                raise FetchError(f"{host} resolves to {text}, a private or link-local address")
        return addresses[0]


def _ip(text: str) -> Optional[ipaddress._BaseAddress]:
    try:
        return ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None


def parse_certificates(body: bytes, where: str = "") -> List[x509.Certificate]:
    """A DER or PEM certificate, or a PKCS#7 (.p7c) bundle of them."""
    loaders = (x509.load_der_x509_certificate, lambda b: x509.load_pem_x509_certificates(b),
               pkcs7.load_der_pkcs7_certificates, pkcs7.load_pem_pkcs7_certificates)
    for load in loaders:
        try:
            found = load(body)
        except ValueError:
            continue
        return list(found) if isinstance(found, list) else [found]  # type: ignore[list-item]
    raise FetchError(f"{where[:120]} holds no readable certificate")
